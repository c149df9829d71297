"""attnops.Operator: a configured operator with every keyword declared (help(), inspect.signature,
IDEs), over the extension's _attnops.Operator, which parses them in C++.

Keywords are keyword-only, with the C++ API's defaults (attnops::AttentionOptions; sinks is its
softmax_aux). backend, softmax_scale, runtime_dtype and num_threads are per-call settings: each
overrides the operator's configuration for this call only, without building another operator.
Any other keyword reaches the extension, which raises a TypeError naming the nearest known one
(e.g. window= -> sliding_window), or for paged calls attnops.InvalidArgument for the dense-only
options (bias, segment ids, mask).
"""

from typing import Any, Dict, Optional, Sequence, Tuple, Union

from . import _attnops

Window = Union[int, Tuple[int, int]]
Backends = Union[str, Sequence[str]]
DTypeLike = Any  # "f32" | "f16" | "bf16", a numpy or torch dtype


class Operator:
    """A configured attention operator from the registry (attnops.registry().get(name, config)).

    op(q, k, v, ...) runs it (attnops.Result), op.plan(...) returns the decision without running,
    op.backward(...) the gradients (attnops.Gradients), op.paged(...) a paged call (ragged_paged).
    """

    __slots__ = ("_impl",)

    def __init__(self, name: str, config: Optional[_attnops.Config] = None) -> None:
        self._impl = _attnops.Operator(name, config)

    def __call__(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        causal: bool = True,
        sliding_window: Optional[Window] = None,
        chunk_size: Optional[int] = None,
        segment_ids_q: Any = None,
        segment_ids_kv: Any = None,
        bias: Any = None,
        logits_soft_cap: Optional[float] = None,
        sinks: Any = None,
        mask: Optional[_attnops.Mask] = None,
        return_lse: bool = False,
        return_weights: bool = False,
        profile: bool = False,
        backend: Optional[Backends] = None,
        softmax_scale: Optional[float] = None,
        runtime_dtype: Optional[DTypeLike] = None,
        num_threads: Optional[int] = None,
        dtype: Optional[DTypeLike] = None,
        **unknown: Any,
    ) -> _attnops.Result:
        """Attention over BTHD arrays: q [B, Tq, Hq, D], k [B, Tk, Hkv, D], v [B, Tk, Hkv, Dv]
        (numpy float32 / float16, uint16 holding bf16 with dtype="bf16", torch CPU tensors through
        DLPack, or attnops.DeviceTensor), used in place; outputs come back as q's kind.

        Returns attnops.Result: out [B, Tq, Hq, Dv], lse [B, Hq, Tq] float32 (return_lse), weights
        [B, Hq, Tq, Tk] float32 (return_weights, vanilla only), decision (dict); it unpacks as
        (out, lse, weights). sliding_window: (left, right) or left; sinks: one logit per q head
        [Hq]; bias: [B|1, Hq|1, Tq, Tk]; mask: an attnops.Mask ANDed with the others. backend
        ("auto", "cpu", "gpu,cpu", [...]), softmax_scale (None: 1/sqrt(D)), runtime_dtype and
        num_threads (0: OpenMP's default) override the operator's configuration for this call.
        """
        if unknown:
            self._impl(q, k, v, **unknown)  # a TypeError naming the nearest known keyword
        # The values in the extension's order (python/src/call.h, Keyword): no dict, no names.
        return self._impl._call(
            q, k, v, causal, sliding_window, chunk_size, segment_ids_q, segment_ids_kv, bias, logits_soft_cap,
            sinks, mask, return_lse, return_weights, profile, backend, softmax_scale, runtime_dtype,
            num_threads, dtype)

    def explain(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        causal: bool = True,
        sliding_window: Optional[Window] = None,
        chunk_size: Optional[int] = None,
        segment_ids_q: Any = None,
        segment_ids_kv: Any = None,
        bias: Any = None,
        logits_soft_cap: Optional[float] = None,
        sinks: Any = None,
        mask: Optional[_attnops.Mask] = None,
        return_lse: bool = False,
        return_weights: bool = False,
        backend: Optional[Backends] = None,
        softmax_scale: Optional[float] = None,
        runtime_dtype: Optional[DTypeLike] = None,
        num_threads: Optional[int] = None,
        dtype: Optional[DTypeLike] = None,
        **unknown: Any,
    ) -> Dict[str, Any]:
        """The decision (a dict) op(q, k, v, ...) would get with these keywords, without running."""
        if unknown:
            self._impl.explain(q, k, v, **unknown)  # a TypeError naming the nearest known keyword
        return self._impl._explain(
            q, k, v, causal, sliding_window, chunk_size, segment_ids_q, segment_ids_kv, bias, logits_soft_cap,
            sinks, mask, return_lse, return_weights, False, backend, softmax_scale, runtime_dtype,
            num_threads, dtype)

    def plan(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        causal: bool = True,
        sliding_window: Optional[Window] = None,
        chunk_size: Optional[int] = None,
        segment_ids_q: Any = None,
        segment_ids_kv: Any = None,
        bias: Any = None,
        logits_soft_cap: Optional[float] = None,
        sinks: Any = None,
        mask: Optional[_attnops.Mask] = None,
        return_lse: bool = False,
        return_weights: bool = False,
        backend: Optional[Backends] = None,
        softmax_scale: Optional[float] = None,
        runtime_dtype: Optional[DTypeLike] = None,
        num_threads: Optional[int] = None,
        dtype: Optional[DTypeLike] = None,
        **unknown: Any,
    ) -> Dict[str, Any]:
        """explain's former name: the same call (plan_paged builds paged work lists)."""
        return self.explain(
            q, k, v, causal=causal, sliding_window=sliding_window, chunk_size=chunk_size,
            segment_ids_q=segment_ids_q, segment_ids_kv=segment_ids_kv, bias=bias,
            logits_soft_cap=logits_soft_cap, sinks=sinks, mask=mask, return_lse=return_lse,
            return_weights=return_weights, backend=backend, softmax_scale=softmax_scale,
            runtime_dtype=runtime_dtype, num_threads=num_threads, dtype=dtype, **unknown)

    def backward(
        self,
        q: Any,
        k: Any,
        v: Any,
        out: Any,
        lse: Any,
        dout: Any,
        *,
        causal: bool = True,
        sliding_window: Optional[Window] = None,
        chunk_size: Optional[int] = None,
        segment_ids_q: Any = None,
        segment_ids_kv: Any = None,
        bias: Any = None,
        logits_soft_cap: Optional[float] = None,
        sinks: Any = None,
        mask: Optional[_attnops.Mask] = None,
        profile: bool = False,
        backend: Optional[Backends] = None,
        softmax_scale: Optional[float] = None,
        runtime_dtype: Optional[DTypeLike] = None,
        num_threads: Optional[int] = None,
        dtype: Optional[DTypeLike] = None,
        **unknown: Any,
    ) -> _attnops.Gradients:
        """Gradients of a forward call with these inputs and keywords: out and lse from that call
        (return_lse=True), dout [B, Tq, Hq, Dv] the gradient of out. Returns attnops.Gradients
        (dq, dk, dv, dsinks, dbias, decision); it unpacks as (dq, dk, dv, dsinks, dbias)."""
        if unknown:
            # return_lse / return_weights (ignored, as in C++) pass; another is a TypeError naming
            # the nearest known keyword.
            unknown.pop("return_lse", None)
            unknown.pop("return_weights", None)
            if unknown:
                self._impl.backward(q, k, v, out, lse, dout, **unknown)
        return self._impl._backward(
            q, k, v, out, lse, dout, causal, sliding_window, chunk_size, segment_ids_q, segment_ids_kv, bias,
            logits_soft_cap, sinks, mask, False, False, profile, backend, softmax_scale, runtime_dtype,
            num_threads, dtype)

    def paged(
        self,
        q: Any,
        cache: _attnops.PagedKVCache,
        batch: Union[_attnops.RaggedBatch, _attnops.PagedPlan],
        *,
        causal: bool = True,
        sliding_window: Optional[Window] = None,
        chunk_size: Optional[int] = None,
        logits_soft_cap: Optional[float] = None,
        sinks: Any = None,
        return_lse: bool = False,
        kv_split_tokens: Optional[int] = None,
        share_prefixes: bool = True,
        backend: Optional[Backends] = None,
        softmax_scale: Optional[float] = None,
        runtime_dtype: Optional[DTypeLike] = None,
        num_threads: Optional[int] = None,
        dtype: Optional[DTypeLike] = None,
        **unknown: Any,
    ) -> _attnops.Result:
        """A paged call (operator ragged_paged): q [N, Hq, D] over cache (attnops.PagedKVCache) for
        batch (an attnops.RaggedBatch, or an attnops.PagedPlan made once per step). Result: out
        [N, Hq, Dv], lse [N, Hq] (return_lse), decision."""
        return self._impl.paged(
            q, cache, batch, causal=causal, sliding_window=sliding_window, chunk_size=chunk_size,
            logits_soft_cap=logits_soft_cap, sinks=sinks, return_lse=return_lse,
            kv_split_tokens=kv_split_tokens, share_prefixes=share_prefixes, backend=backend,
            softmax_scale=softmax_scale,
            runtime_dtype=runtime_dtype, num_threads=num_threads, dtype=dtype, **unknown)

    def explain_paged(
        self,
        q: Any,
        cache: _attnops.PagedKVCache,
        batch: Union[_attnops.RaggedBatch, _attnops.PagedPlan],
        *,
        causal: bool = True,
        sliding_window: Optional[Window] = None,
        chunk_size: Optional[int] = None,
        logits_soft_cap: Optional[float] = None,
        sinks: Any = None,
        return_lse: bool = False,
        kv_split_tokens: Optional[int] = None,
        share_prefixes: bool = True,
        backend: Optional[Backends] = None,
        softmax_scale: Optional[float] = None,
        runtime_dtype: Optional[DTypeLike] = None,
        num_threads: Optional[int] = None,
        dtype: Optional[DTypeLike] = None,
        **unknown: Any,
    ) -> Dict[str, Any]:
        """The decision (a dict) a paged call would get with these keywords, without running it."""
        return self._impl.explain_paged(
            q, cache, batch, causal=causal, sliding_window=sliding_window, chunk_size=chunk_size,
            logits_soft_cap=logits_soft_cap, sinks=sinks, return_lse=return_lse,
            kv_split_tokens=kv_split_tokens, share_prefixes=share_prefixes, backend=backend,
            softmax_scale=softmax_scale,
            runtime_dtype=runtime_dtype, num_threads=num_threads, dtype=dtype, **unknown)

    def _time_calls(self, q: Any, k: Any, v: Any, n: int, **options: Any) -> Tuple[float, float]:
        """Benchmark baseline: (wall, thread CPU) seconds per call of the same call made n times
        from C++."""
        return self._impl._time_calls(q, k, v, n, **options)

    @property
    def name(self) -> str:
        """The canonical name of the requested operator."""
        return self._impl.name

    @property
    def aliases(self) -> list:
        return self._impl.aliases

    @property
    def metadata(self) -> Dict[str, Any]:
        """The operator's settings after the config (backend order, fallbacks, ...)."""
        return self._impl.metadata

    def implements(self, backend: str) -> bool:
        """Whether the operator has a forward for this backend."""
        return self._impl.implements(backend)

    def implements_backward(self, backend: str) -> bool:
        """Whether the operator has a backward for this backend."""
        return self._impl.implements_backward(backend)

    def returns_weights(self) -> bool:
        return self._impl.returns_weights()

    def __repr__(self) -> str:
        return repr(self._impl)
