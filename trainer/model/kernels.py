"""QK-norm and rotary in one pass over q and k: a CUDA or Metal kernel with a custom VJP, the
same math in MLX ops (its mirror, testable on any device), and the plain composition of
`mx.fast.rope` and `mx.fast.rms_norm` it replaces (the reference).

Every function here takes the projections as token-major rows, (B, T, H, D) with D the head
size (H may be a shard of the heads), normalizes each row by its RMS (no gain, as nanochat)
and rotates it by its position, with MLX's non-traditional rotary: dimension i pairs with
i + D/2 and turns by (offset + t) * base^(-2i/D). The RMS of a row does not change under
the rotation, so normalizing first and rotating after is the same function as the model's
"QK-norm after rotary"; doing both in one pass reads and writes each of q and k once where
the plain path reads and writes them twice, plus its layout copies.

The kernels keep one warp (a Metal SIMD group) per row: lane j holds pairs (j, j + D/2),
(j + 32, j + 32 + D/2), ..., so a row's sum of squares is one warp reduction and the
rotation needs no exchange between lanes. The backward pass recomputes the norm from the
input (D numbers a row) instead of keeping it: the VJP of y = R(x r), r = (mean(x²) +
eps)^(-1/2), is dx = r dn - x r³ mean(dn x) with dn = Rᵀ dy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache

import mlx.core as mx

WARP = 32  # lanes a row: one CUDA warp, one Apple SIMD group
ROWS_PER_GROUP = 8  # rows a thread block works on (256 threads)

Pair = tuple[mx.array, mx.array]


# --- the plain composition (today's model, the reference) ------------------------------------
def plain(q: mx.array, k: mx.array, *, eps: float, base: float, offset: int = 0) -> Pair:
    """(B, T, H, D) rows in, (B, H, T, D) out, heads-first and contiguous: the model as it
    was, rotary (`mx.fast.rope` on the transposed view) then `mx.fast.rms_norm`."""
    D = q.shape[-1]

    def one(x: mx.array) -> mx.array:
        x = mx.fast.rope(
            x.transpose(0, 2, 1, 3), D, traditional=False, base=base, scale=1.0, offset=offset
        )
        return mx.fast.rms_norm(x, None, eps)

    return one(q), one(k)


def strided(q: mx.array, k: mx.array, *, eps: float, base: float, offset: int = 0) -> Pair:
    """The same MLX kernels without the layout copies: `mx.fast.rms_norm` on the token-major
    rows (contiguous as the projection wrote them), then `mx.fast.rope` on the transposed
    view, which keeps its input's strides. Out: (B, H, T, D) views of token-major memory,
    which SDPA reads as they are and whose output then needs no copy to become (B, T, C)."""
    D = q.shape[-1]

    def one(x: mx.array) -> mx.array:
        x = mx.fast.rms_norm(x, None, eps).transpose(0, 2, 1, 3)
        return mx.fast.rope(x, D, traditional=False, base=base, scale=1.0, offset=offset)

    return one(q), one(k)


# --- the same math as the kernels, in MLX ops -------------------------------------------------
def rotary_tables(T: int, D: int, base: float, offset: int | mx.array = 0) -> Pair:
    """cos and sin, (T, D/2) in FP32, of the angles MLX's rope kernels compute: position
    (offset + t) times exp2(-(i / (D/2)) log2(base))."""
    half = D // 2
    inv_freq = mx.power(2.0, -(mx.arange(half, dtype=mx.float32) / half) * math.log2(base))
    pos = (mx.arange(T) + offset).astype(mx.float32)
    theta = pos[:, None] * inv_freq[None, :]
    return mx.cos(theta), mx.sin(theta)


def _tables_for(x: mx.array, base: float, offset: mx.array) -> Pair:
    cos, sin = rotary_tables(x.shape[1], x.shape[-1], base, offset)
    return cos[None, :, None, :], sin[None, :, None, :]  # broadcast over (B, T, H, D/2)


def _ops_forward(x: mx.array, eps: float, base: float, offset: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    xf = x.astype(mx.float32)
    r = mx.rsqrt(mx.mean(xf * xf, axis=-1, keepdims=True) + eps)
    n1, n2 = xf[..., :half] * r, xf[..., half:] * r
    cos, sin = _tables_for(x, base, offset)
    return mx.concatenate([n1 * cos - n2 * sin, n1 * sin + n2 * cos], axis=-1).astype(x.dtype)


def _ops_backward(x: mx.array, dy: mx.array, eps: float, base: float, offset: mx.array) -> mx.array:
    """The kernels' backward pass in ops: dn = Rᵀ dy, dx = r dn - x r³ mean(dn x)."""
    half = x.shape[-1] // 2
    xf, g = x.astype(mx.float32), dy.astype(mx.float32)
    cos, sin = _tables_for(x, base, offset)
    g1, g2 = g[..., :half], g[..., half:]
    dn = mx.concatenate([g1 * cos + g2 * sin, g2 * cos - g1 * sin], axis=-1)
    r = mx.rsqrt(mx.mean(xf * xf, axis=-1, keepdims=True) + eps)
    coef = mx.mean(dn * xf, axis=-1, keepdims=True) * r * r * r
    return (r * dn - xf * coef).astype(x.dtype)


@cache
def _ops_pair(eps: float, base: float) -> Callable:
    @mx.custom_function
    def f(q: mx.array, k: mx.array, offset: mx.array):
        return _ops_forward(q, eps, base, offset), _ops_forward(k, eps, base, offset)

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        q, k, offset = primals
        dq, dk = cotangents
        return (
            _ops_backward(q, dq, eps, base, offset),
            _ops_backward(k, dk, eps, base, offset),
            mx.zeros_like(offset),
        )

    return f


def ops(q: mx.array, k: mx.array, *, eps: float, base: float, offset: int = 0) -> Pair:
    """The kernels' math in MLX ops, forward and (custom) backward: token-major in and out,
    returned as (B, H, T, D) views. What the kernels are tested against on any device."""
    f = _ops_pair(float(eps), float(base))
    qn, kn = f(q, k, mx.array([offset], dtype=mx.int32))
    return qn.transpose(0, 2, 1, 3), kn.transpose(0, 2, 1, 3)


# --- the kernels ------------------------------------------------------------------------------
# One source for CUDA and Metal: the bodies differ only in how a thread finds its index and
# how a warp sums. q, k: (B, T, H, D) rows; dq, dk: the cotangents in the output's layout;
# offset: (1,) int32, the first position. Template: T (dtype), D, HEADS_FIRST (output layout).
# Inputs are read through their strides, never copied first (views of a packed projection,
# cotangents in any layout); outputs are written contiguous.
_ROW = """
    // 32-bit indices (rows * 64 lanes stays far below 2^31 at any size a GPU holds); the
    // pointer offsets are 64-bit.
    const int B = q_shape[0], L = q_shape[1], H = q_shape[2];
    const unsigned rows = (unsigned)B * L * H;
    const unsigned row = gid / {warp};
    const int lane = gid % {warp};
    if (row >= 2 * rows) return;  // whole warps: the grid is a multiple of the warp
    const bool is_q = row < rows;
    const unsigned r = is_q ? row : row - rows;
    const unsigned h = r % H;
    const unsigned t = (r / H) % L;
    const unsigned b = r / (H * L);
    const int64_t x_at = is_q ? b * q_strides[0] + t * q_strides[1] + h * q_strides[2]
                              : b * k_strides[0] + t * k_strides[1] + h * k_strides[2];
    const int64_t xs = is_q ? q_strides[3] : k_strides[3];
    const float pos = (float)((int)t + offset[0]);
    constexpr int HALF = D / 2;
    constexpr int NP = (HALF + {warp} - 1) / {warp};  // pairs a lane holds
"""

_FORWARD = """
    const int64_t out_row = HEADS_FIRST ? ((int64_t)(b * H + h) * L + t) : (int64_t)r;
    auto x = (is_q ? q : k) + x_at;  // auto: Metal's address space, as declared
    auto y = (is_q ? q_out : k_out) + out_row * D;
    float x1[NP], x2[NP];
    float ss = 0.0f;
    for (int p = 0; p < NP; ++p) {{
      int i = lane + p * {warp};
      x1[p] = i < HALF ? static_cast<float>(x[i * xs]) : 0.0f;
      x2[p] = i < HALF ? static_cast<float>(x[(i + HALF) * xs]) : 0.0f;
      ss += x1[p] * x1[p] + x2[p] * x2[p];
    }}
    ss = {warp_sum}(ss);
    const float rstd = {rsqrt}(ss / D + EPS);
    for (int p = 0; p < NP; ++p) {{
      int i = lane + p * {warp};
      if (i < HALF) {{
        float theta = pos * {exp2}(-((float)i / (float)HALF) * LOG2_BASE);
        float c, s;
        {sincos};
        float n1 = x1[p] * rstd, n2 = x2[p] * rstd;
        y[i] = static_cast<T>(n1 * c - n2 * s);
        y[i + HALF] = static_cast<T>(n1 * s + n2 * c);
      }}
    }}
"""

_BACKWARD = """
    // The cotangent's strides, in its (output's) axis order.
    const int64_t g0 = is_q ? dq_strides[0] : dk_strides[0];
    const int64_t g1s = is_q ? dq_strides[1] : dk_strides[1];
    const int64_t g2s = is_q ? dq_strides[2] : dk_strides[2];
    const int64_t gs = is_q ? dq_strides[3] : dk_strides[3];
    const int64_t dy_at = HEADS_FIRST ? b * g0 + h * g1s + t * g2s : b * g0 + t * g1s + h * g2s;
    auto x = (is_q ? q : k) + x_at;  // auto: Metal's address space, as declared
    auto dy = (is_q ? dq : dk) + dy_at;
    auto dx = (is_q ? q_grad : k_grad) + (int64_t)r * D;
    float x1[NP], x2[NP], d1[NP], d2[NP];
    float ss = 0.0f, sd = 0.0f;
    for (int p = 0; p < NP; ++p) {{
      int i = lane + p * {warp};
      x1[p] = x2[p] = d1[p] = d2[p] = 0.0f;
      if (i < HALF) {{
        float theta = pos * {exp2}(-((float)i / (float)HALF) * LOG2_BASE);
        float c, s;
        {sincos};
        float g1 = static_cast<float>(dy[i * gs]), g2 = static_cast<float>(dy[(i + HALF) * gs]);
        x1[p] = static_cast<float>(x[i * xs]);
        x2[p] = static_cast<float>(x[(i + HALF) * xs]);
        d1[p] = g1 * c + g2 * s;  // dn = R^T dy
        d2[p] = g2 * c - g1 * s;
      }}
      ss += x1[p] * x1[p] + x2[p] * x2[p];
      sd += d1[p] * x1[p] + d2[p] * x2[p];
    }}
    ss = {warp_sum}(ss);
    sd = {warp_sum}(sd);
    const float rstd = {rsqrt}(ss / D + EPS);
    const float coef = (sd / D) * rstd * rstd * rstd;
    for (int p = 0; p < NP; ++p) {{
      int i = lane + p * {warp};
      if (i < HALF) {{
        dx[i] = static_cast<T>(rstd * d1[p] - x1[p] * coef);
        dx[i + HALF] = static_cast<T>(rstd * d2[p] - x2[p] * coef);
      }}
    }}
"""

_CUDA = {
    "gid": "const unsigned gid = blockIdx.x * blockDim.x + threadIdx.x;",
    "header": """
__device__ inline float qk_warp_sum(float v) {{
  for (int o = {half_warp}; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}}
""",
    "warp_sum": "qk_warp_sum",
    "rsqrt": "rsqrtf",
    "exp2": "exp2f",
    "sincos": "sincosf(theta, &s, &c)",  # accurate (NVRTC runs without --use_fast_math)
}
_METAL = {
    "gid": "const unsigned gid = thread_position_in_grid.x;",
    "header": "",
    "warp_sum": "metal::simd_sum",
    "rsqrt": "metal::precise::rsqrt",
    "exp2": "metal::precise::exp2",
    "sincos": "s = metal::precise::sincos(theta, c)",
}


def kernel_sources(backend: str, eps: float, base: float) -> dict[str, str]:
    """The header and the forward and backward bodies for "cuda" or "metal"."""
    w = _CUDA if backend == "cuda" else _METAL
    consts = (
        f"constant constexpr float EPS = {eps!r}f;\n"
        f"constant constexpr float LOG2_BASE = {math.log2(base)!r}f;\n"
        if backend == "metal"
        else f"constexpr float EPS = {eps!r}f;\nconstexpr float LOG2_BASE = {math.log2(base)!r}f;\n"
    )
    fmt = dict(w, warp=WARP, half_warp=WARP // 2)
    row = w["gid"] + _ROW.format(**fmt)
    return {
        "header": consts + w["header"].format(**fmt),
        "forward": row + _FORWARD.format(**fmt),
        "backward": row + _BACKWARD.format(**fmt),
    }


def gpu_backend() -> str | None:
    """ "cuda" or "metal" when the default device is a GPU with custom kernels, else None."""
    if mx.default_device() != mx.gpu:
        return None
    if mx.cuda.is_available():
        return "cuda"
    if mx.metal.is_available():
        return "metal"
    return None


@cache
def _kernels(backend: str, eps: float, base: float) -> tuple[Callable, Callable]:
    src = kernel_sources(backend, eps, base)
    make = mx.fast.cuda_kernel if backend == "cuda" else mx.fast.metal_kernel
    fwd = make(
        name="qk_norm_rope_fwd",
        input_names=["q", "k", "offset"],
        output_names=["q_out", "k_out"],
        source=src["forward"],
        header=src["header"],
        ensure_row_contiguous=False,  # read through strides (_ROW)
    )
    bwd = make(
        name="qk_norm_rope_bwd",
        input_names=["q", "k", "dq", "dk", "offset"],
        output_names=["q_grad", "k_grad"],
        source=src["backward"],
        header=src["header"],
        ensure_row_contiguous=False,
    )
    return fwd, bwd


def _launch(kernel: Callable, inputs: list[mx.array], shapes, dtype, D: int, heads_first: bool):
    rows = 2 * inputs[0].size // D  # q's rows and k's
    return kernel(
        inputs=inputs,
        template=[("T", dtype), ("D", D), ("HEADS_FIRST", heads_first)],
        grid=(rows * WARP, 1, 1),
        threadgroup=(ROWS_PER_GROUP * WARP, 1, 1),
        output_shapes=shapes,
        output_dtypes=[dtype, dtype],
    )


@cache
def _kernel_pair(backend: str, eps: float, base: float, heads_first: bool) -> Callable:
    fwd, bwd = _kernels(backend, eps, base)

    @mx.custom_function
    def f(q: mx.array, k: mx.array, offset: mx.array):
        B, T, H, D = q.shape
        shape = (B, H, T, D) if heads_first else q.shape
        return tuple(_launch(fwd, [q, k, offset], [shape, shape], q.dtype, D, heads_first))

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        q, k, offset = primals
        dq, dk = (c.astype(q.dtype) for c in cotangents)
        D = q.shape[-1]
        inputs = [q, k, dq, dk, offset]
        gq, gk = _launch(bwd, inputs, [q.shape, k.shape], q.dtype, D, heads_first)
        return gq, gk, mx.zeros_like(offset)

    return f


def fused(
    q: mx.array,
    k: mx.array,
    *,
    eps: float,
    base: float,
    offset: int = 0,
    heads_first: bool = False,
) -> Pair:
    """One pass over q and k, forward and backward, where a GPU kernel exists (CUDA, Metal);
    the `ops` mirror elsewhere. Out: (B, H, T, D), views of token-major memory (what SDPA
    reads without copies), or heads-first contiguous arrays with `heads_first` (the kernel
    alone, for measuring it against the plain path)."""
    backend = gpu_backend()
    if backend is None:
        qn, kn = ops(q, k, eps=eps, base=base, offset=offset)
        return (mx.contiguous(qn), mx.contiguous(kn)) if heads_first else (qn, kn)
    if q.shape[-1] % 2 or q.dtype not in (mx.float32, mx.float16, mx.bfloat16):
        raise ValueError(
            f"fused QK-norm needs an even head size and a float dtype, got {q.shape} {q.dtype}"
        )
    f = _kernel_pair(backend, float(eps), float(base), heads_first)
    qn, kn = f(q, k, mx.array([offset], dtype=mx.int32))
    return (qn, kn) if heads_first else (qn.transpose(0, 2, 1, 3), kn.transpose(0, 2, 1, 3))


PATHS: dict[str, Callable[..., Pair]] = {
    "plain": plain,
    "strided": strided,
    "fused": fused,
    "fused-heads": lambda q, k, **kw: fused(q, k, heads_first=True, **kw),
}
"""The model's ways to QK-norm and rotate: "plain" as it was; "strided" the same kernels
without layout copies; "fused" one pass, token-major (lever 1 and the layout together);
"fused-heads" one pass writing heads-first (lever 1 alone)."""
