"""Object-store access: AWS Signature Version 4 (pure, sigv4.py) and the S3 client on it (shell, s3.py)."""
