"""Execute a TensorRT ``INetworkDefinition`` on the CPU with NumPy.

The second independent check beside :mod:`trt_kv.reference`: it runs the network trt_kv
actually built, layer by layer, so a wrong wire in the builder shows up without a GPU.

    plan = compile_network(network)          # once: downcast layers, convert weights
    outputs = plan.run({"input_ids": ids, "past_key.0": k0, ...})   # per step

``execute(network, feed)`` does both in one call.

Semantics
    Layers run in dependency order (layers no output needs are skipped). Network inputs are
    validated (present, dtype, rank, static dims). A KV-cache update (native layer or trt_kv's
    plugin) writes the caller's fed cache array in place and returns that same object as the
    output, like TensorRT's aliased output (``wide_float16_caches``: a float16 cache is fed
    as a float32 array of float16 values, read without widening, same results); a write
    past ``S_max`` raises CacheOverflowError before anything is written (TensorRT would skip
    it silently). Layer types or settings the interpreter does not execute raise
    UnsupportedLayerError at compile time, naming the layer and its type, and for a network
    TensorRT's ONNX parser made, the ONNX node (from the layer's metadata). Where TensorRT's
    documentation leaves a meaning open, the chosen reading is noted in the handler and
    listed in docs/gpu-results.md.

ONNX networks
    The layers TensorRT's ``OnnxParser`` emits for decoders exported by torch run too: shape
    arithmetic on int64 tensors at run time (SHAPE, GATHER, CONCATENATION, a SHUFFLE's
    reshape from input 1, FILL with dynamic start and delta, SLICE with dynamic bounds and
    sample modes), SELECT, CAST, bool/int ELEMENTWISE and UNARY, SCATTER, CUMULATIVE,
    ONE_HOT, EINSUM, TopK with k as a tensor, IAttention and the KV-cache update of
    ``TensorScatter``; tests/interpreter/test_onnx_*.py compare them with onnxruntime.

Numerics and tolerance policy
    Floats are computed in float32 (``precision="float64"``: float64) and every layer output is
    rounded to its declared dtype, so float16/bfloat16 networks round at each tensor boundary
    as TensorRT does; inside a layer there is no intermediate rounding (TensorRT may keep
    float16 accumulators, or fuse layers and skip a boundary). Expect:

    - float32 networks vs a NumPy expression in float32: within 1e-5 relative (1e-6 absolute
      near zero); float64 precision tightens that to float32 rounding of each output.
    - float16 / bfloat16 networks: each tensor is the exactly rounded value of the float32
      computation of its layer, so compare against NumPy with one rounding per tensor, or
      within 1e-3 (float16) / 1e-2 (bfloat16) relative per layer.
    - vs a GPU engine: differences of a few ulps of the declared dtype per layer, growing with
      depth; compare logits of a whole model at ~1e-2 relative for float16.
    Integer and bool tensors are exact.
"""

from trt_kv.interpreter.executor import FeedError, Plan, compile_network, execute

Interpreter = Plan

__all__ = ["FeedError", "Interpreter", "Plan", "compile_network", "execute"]
