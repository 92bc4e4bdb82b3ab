"""What lets SGLang 0.5.23 run on the CPU testbed and its storage backends: the torch-native extend attention
over a prefix (`attention`), the KV copy ops and host pools on CPU (`cpu`, `kvcacheio_cpu`), the HiCache file
backend's directory race (`hicache_file`). Imports nothing of the plugin but the shared modules."""
