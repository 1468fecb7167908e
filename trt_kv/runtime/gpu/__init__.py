"""The GPU side of the runtime: TensorRT engines on a CUDA device.

- :mod:`~trt_kv.runtime.gpu.cuda`: CUDA through cuda-python (device buffers, streams, whether a
  GPU is usable and why not);
- :mod:`~trt_kv.runtime.gpu.device`: KV caches in device memory (``DeviceCaches``);
- :mod:`~trt_kv.runtime.gpu.engine_loader`: an engine file and its sidecar, deserialized;
- :mod:`~trt_kv.runtime.gpu.runtime_cache`: TensorRT-RTX's just-in-time kernel cache file;
- :mod:`~trt_kv.runtime.gpu.trt_backend`: ``TrtBackend``, the fast path (tensor addresses set
  once, in-place caches, optional CUDA graph);
- :mod:`~trt_kv.runtime.gpu.polygraphy_backend`: ``PolygraphyBackend`` over Polygraphy's
  ``TrtRunner``.

Nothing here is imported by ``trt_kv.runtime`` itself, so the CPU runtime never needs CUDA.
Without a GPU, :func:`trt_kv.emulator.emulated_gpu` stands in for CUDA and TensorRT's runtime.
"""
