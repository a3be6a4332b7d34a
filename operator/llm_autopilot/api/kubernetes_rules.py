"""The API server's own rules for the values the operator copies into the Deployment, Service and PDB.

Each check mirrors the Kubernetes code that would otherwise reject the rendered object with a 422 after
``kubectl apply`` said OK. The regular expressions are RE2- and Rust-compatible (no look-arounds), so the
same text serves as a pydantic check and as a CRD ``pattern``. Sources (read, not copied):

- k8s.io/apimachinery pkg/util/validation/validation.go: IsDNS1035Label, IsDNS1123Subdomain, IsEnvVarName
  (with hasChDirPrefix), IsConfigMapKey;
- k8s.io/apimachinery pkg/api/validate/content/kube.go: IsLabelKey (= IsQualifiedName), IsLabelValue;
- k8s.io/apimachinery pkg/api/resource/quantity.go: the quantity grammar (parseQuantityString, suffix.go);
- k8s.io/kubernetes pkg/apis/core/validation/validation.go: ValidateEnv, validateEnvVarValueFrom,
  validateObjectFieldSelector, validateContainerResourceDivisor, ValidateResourceRequirements,
  ValidateTolerations;
- github.com/distribution/reference regexp.go: ReferenceRegexp (what the kubelet parses an image with).
"""

from __future__ import annotations

import re
from fractions import Fraction

# --- names ------------------------------------------------------------------------------------------------

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
#: IsDNS1035Label: what a Service name must be (at most 63 characters).
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS1035_LABEL_MAX = 63
#: IsDNS1123Subdomain: Secret and ConfigMap names (at most 253 characters).
DNS1123_SUBDOMAIN = rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$"
DNS1123_SUBDOMAIN_MAX = 253

_LABEL_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
#: IsLabelKey: an optional DNS-subdomain prefix and '/', then a name part of at most 63 characters.
LABEL_KEY = rf"^({_DNS1123_LABEL}(\.{_DNS1123_LABEL})*/)?{_LABEL_NAME}$"
LABEL_KEY_MAX = DNS1123_SUBDOMAIN_MAX + 1 + 63
#: IsLabelValue: empty, or a label name part (at most 63 characters).
LABEL_VALUE = rf"^({_LABEL_NAME})?$"
LABEL_VALUE_MAX = 63

#: IsEnvVarName: `[-._a-zA-Z][-._a-zA-Z0-9]*` that is not '.', '..' and does not start with '..'
#: (hasChDirPrefix). Kubernetes >= 1.34 relaxes this to printable ASCII without '=' (feature
#: RelaxedEnvironmentVariableValidation); the strict form is valid on every supported cluster.
ENV_VAR_NAME = r"^([-_a-zA-Z][-._a-zA-Z0-9]*|\.[-_a-zA-Z0-9][-._a-zA-Z0-9]*)$"
#: IsConfigMapKey: `[-._a-zA-Z0-9]+`, at most 253, not '.', '..' and not starting with '..'.
CONFIG_KEY = r"^([-_a-zA-Z0-9][-._a-zA-Z0-9]*|\.[-_a-zA-Z0-9][-._a-zA-Z0-9]*)$"

_DNS1035_RE = re.compile(DNS1035_LABEL)
_SUBDOMAIN_RE = re.compile(DNS1123_SUBDOMAIN)
_LABEL_NAME_RE = re.compile(rf"^{_LABEL_NAME}$")
_LABEL_VALUE_RE = re.compile(LABEL_VALUE)
_ENV_VAR_NAME_RE = re.compile(ENV_VAR_NAME)
_CONFIG_KEY_RE = re.compile(CONFIG_KEY)


def object_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an LLMDeployment, whose name is also its Service's name and a label value."""
    if len(name) <= DNS1035_LABEL_MAX and _DNS1035_RE.fullmatch(name):
        return None
    return (f"{name!r} is not allowed: the name is also the Service's name, so it must be a DNS-1035 label: "
            f"at most {DNS1035_LABEL_MAX} lowercase letters, digits and '-', starting with a letter and ending "
            "with a letter or digit (e.g. qwen3-8b)")


def subdomain_problem(value: str) -> str | None:
    if len(value) <= DNS1123_SUBDOMAIN_MAX and _SUBDOMAIN_RE.fullmatch(value):
        return None
    return (f"{value!r} is not a valid object name: at most {DNS1123_SUBDOMAIN_MAX} lowercase letters, digits, "
            "'-' and '.', starting and ending with a letter or digit")


def label_key_problem(key: str) -> str | None:
    parts = key.split("/")
    if len(parts) == 2 and (not parts[0] or len(parts[0]) > DNS1123_SUBDOMAIN_MAX
                            or not _SUBDOMAIN_RE.fullmatch(parts[0])):
        return (f"{key!r} is not a valid label key: the prefix before '/' must be a DNS subdomain "
                "(e.g. example.com/pool)")
    name = parts[-1]
    if len(parts) > 2 or len(name) > LABEL_VALUE_MAX or not _LABEL_NAME_RE.fullmatch(name):
        return (f"{key!r} is not a valid label key: at most {LABEL_VALUE_MAX} letters, digits, '-', '_' or '.' "
                "(starting and ending with a letter or digit), optionally after a DNS-subdomain prefix and '/'")
    return None


def label_value_problem(value: str) -> str | None:
    if len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE_RE.fullmatch(value):
        return None
    return (f"{value!r} is not a valid label value: at most {LABEL_VALUE_MAX} letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit")


def env_var_name_problem(name: str) -> str | None:
    if _ENV_VAR_NAME_RE.fullmatch(name):
        return None
    return (f"{name!r} is not a valid environment variable name: letters, digits, '_', '-' and '.', "
            "not starting with a digit or '..' (e.g. VLLM_LOGGING_LEVEL)")


def config_key_problem(key: str) -> str | None:
    if len(key) <= DNS1123_SUBDOMAIN_MAX and _CONFIG_KEY_RE.fullmatch(key):
        return None
    return (f"{key!r} is not a valid Secret or ConfigMap key: at most {DNS1123_SUBDOMAIN_MAX} letters, digits, "
            "'-', '_' and '.', not '.' or '..' and not starting with '..'")


# --- images -------------------------------------------------------------------------------------------------

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[(?:[a-fA-F0-9:]+)\])"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}"
#: distribution/reference ReferenceRegexp: [host[:port]/]path[:tag][@digest], lowercase path.
IMAGE_REFERENCE = (rf"^(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
                   rf"(?::{_TAG})?(?:@{_DIGEST})?$")
#: distribution/reference RepositoryNameTotalLengthMax is 255 for the name; room for a tag and a digest.
IMAGE_MAX = 512
_IMAGE_RE = re.compile(IMAGE_REFERENCE)


def image_problem(image: str) -> str | None:
    if len(image) <= IMAGE_MAX and _IMAGE_RE.fullmatch(image):
        return None
    return (f"{image!r} is not a container image reference: [registry[:port]/]repository[:tag][@digest], "
            "the repository in lowercase, without spaces (e.g. vllm/vllm-openai:v0.33.0)")


# --- quantities ---------------------------------------------------------------------------------------------

#: The quantity grammar without a sign (container resources must not be negative):
#: <number> = digits | digits.digits | digits. | .digits, then a binary-SI, decimal-SI or exponent suffix.
QUANTITY = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]{1,3})?$"
QUANTITY_MAX = 64
_QUANTITY_RE = re.compile(QUANTITY)
_SUFFIXES = {
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
}


def parse_quantity(value: int | str) -> Fraction:
    """The exact value of a non-negative quantity ("24Gi", "500m", "1.5e3", 4); ValueError if it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative")
        return Fraction(value)
    match = _QUANTITY_RE.fullmatch(value)
    if not match:
        raise ValueError(f"{value!r} is not a quantity")
    number, suffix = match.group(1), match.group(3) or ""
    amount = Fraction(number + "0" if number.endswith(".") else number)
    if suffix in _SUFFIXES:
        return amount * _SUFFIXES[suffix]
    return amount * Fraction(10) ** int(suffix[1:])  # an exponent: e3, E-2


def quantity_problem(value: int | str) -> str | None:
    try:
        parse_quantity(value)
    except ValueError as exc:
        return f"{exc}: use a non-negative Kubernetes quantity such as 8, 500m, 64Gi or 1.5e9"
    return None


# --- downward API -------------------------------------------------------------------------------------------

#: validEnvDownwardAPIFieldPathExpressions, plus metadata.labels['key'] / metadata.annotations['key'].
ENV_FIELD_PATH = (r"^(metadata\.(name|namespace|uid)|spec\.(nodeName|serviceAccountName)"
                  r"|status\.(hostIP|hostIPs|podIP|podIPs)|metadata\.(labels|annotations)\['[^']+'\])$")
_FIELD_PATH_RE = re.compile(ENV_FIELD_PATH)
#: validContainerResourceFieldPathExpressions.
ENV_RESOURCE_FIELDS = ("limits.cpu", "limits.memory", "limits.ephemeral-storage",
                       "requests.cpu", "requests.memory", "requests.ephemeral-storage")
#: validContainerResourceDivisorFor{CPU,Memory,EphemeralStorage}, as Quantity.String() spells them.
CPU_DIVISORS = ("1m", "1")
BYTE_DIVISORS = ("1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei")


def field_path_problem(path: str) -> str | None:
    match = _FIELD_PATH_RE.fullmatch(path)
    if match and path.endswith("']"):  # a subscript: the key must be a label key (annotations: in lower case)
        key = path[path.index("['") + 2:-2]
        problem = label_key_problem(key.lower() if path.startswith("metadata.annotations") else key)
        return problem and f"{path!r}: {problem}"
    if match:
        return None
    return (f"{path!r} is not a field an environment variable can read: metadata.name, metadata.namespace, "
            "metadata.uid, metadata.labels['KEY'], metadata.annotations['KEY'], spec.nodeName, "
            "spec.serviceAccountName, status.hostIP, status.hostIPs, status.podIP or status.podIPs")


def divisor_problem(resource: str, divisor: int | str) -> str | None:
    allowed = CPU_DIVISORS if resource.endswith(".cpu") else BYTE_DIVISORS
    if str(divisor) in allowed:
        return None
    return f"divisor {divisor!r} is not supported with {resource}; use one of {', '.join(allowed)}"
