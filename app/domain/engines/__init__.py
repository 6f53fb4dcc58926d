"""Serving-engine memory models: what an inference engine does with a GPU's memory at start-up.

One engine-neutral computation (:mod:`app.domain.engines.vllm`: requested memory, weights,
profile-run peak, memory outside the allocator, KV pool, KV tokens, concurrency, start verdict)
parameterised by an :class:`~app.domain.engines.vllm.EngineProfile` of per-engine constants,
each naming its source. vLLM 0.19 is the first profile; another engine (SGLang, TGI,
TensorRT-LLM) is a second profile, not a fork.
"""
