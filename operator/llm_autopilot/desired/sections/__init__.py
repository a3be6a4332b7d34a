"""desired()'s sections: one module per part of the status, each a pure function over the Draft
(desired/vocabulary.py). A section never imports another section nor the pipeline (desired/pipeline.py), which
alone runs them in order (tests/unit/test_layering.py)."""
