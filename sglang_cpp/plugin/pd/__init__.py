"""PD disaggregation with PP on the prefill side: the early KV send (`kv`) and the release ring (`ring`)."""
