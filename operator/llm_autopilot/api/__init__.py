"""The LLMDeployment API (group llm-autopilot.io): pydantic models are the source of truth for the CRD."""

GROUP = "llm-autopilot.io"
VERSION = "v1alpha1"
KIND = "LLMDeployment"
PLURAL = "llmdeployments"
SINGULAR = "llmdeployment"
SHORT_NAMES = ("llmd",)
