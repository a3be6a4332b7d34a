"""Pure planning: the vLLM memory model and the search for the cheapest deployment that fits."""
