"""What onnxruntime's `GroupQueryAttention` does with a window-sized cache
(`sliding_window_cache=1`) on a right-padded batch, ONNX Runtime GenAI's batch: one
kernel on random numbers against attention computed here (a window of held tokens,
attention sinks), for a prompt of 3 rows of different lengths and 9 decode steps.

- Without `query_seqlens` the kernel refuses the right-padded prompt ("seqlens_k[1] = 6
  is too small for sequence_length 12"): the error ONNX Runtime GenAI reports on the
  model builder's own windowed folder for such a batch.
- With `query_seqlens` (each row's count of held new tokens) and `seqlens_k` counted in
  held tokens (each row's count minus one), the prompt and every decode step equal the
  attention computed here, and after each step rows [0, L) of the present buffer hold
  the row's last L held tokens, L = T if T <= C else T - G * ceil((T - C) / G), G = C -
  W + 1 (C the buffer's length, W the window, T the row's held tokens), as the operator's
  description says.

The kernel's slots are then the row's held tokens, never its padding: exact for a
right-padded batch where the slots are counted that way.

    python bench/windowed_kernel_contract.py   (a second)
"""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

BATCH, CHUNK, HEADS, KV_HEADS, HEAD, WINDOW, CAPACITY = 3, 12, 4, 2, 8, 4, 6
LENGTHS, STEPS = (12, 7, 3), 9
QUERY_SEQLENS = 16  # the kernel's input index of `query_seqlens`


def session(query_seqlens: bool) -> ort.InferenceSession:
    names = ["q", "k", "v", "past_k", "past_v", "seqlens", "total", "", "", "", "", "sinks"]
    if query_seqlens:
        names += [""] * (QUERY_SEQLENS - len(names)) + ["query_seqlens"]
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_k", "present_v"], domain="com.microsoft",
                            num_heads=HEADS, kv_num_heads=KV_HEADS, local_window_size=WINDOW, sliding_window_cache=1)

    def typed(name: str, shape: list, dtype: int = TensorProto.FLOAT) -> helper.ValueInfoProto:
        return helper.make_tensor_value_info(name, dtype, shape)

    inputs = [typed("q", ["b", "s", HEADS * HEAD]), typed("k", ["b", "s", KV_HEADS * HEAD]),
              typed("v", ["b", "s", KV_HEADS * HEAD]), typed("past_k", ["b", KV_HEADS, "c", HEAD]),
              typed("past_v", ["b", KV_HEADS, "c", HEAD]), typed("seqlens", ["b"], TensorProto.INT32),
              typed("total", [], TensorProto.INT32), typed("sinks", [HEADS])]
    if query_seqlens:
        inputs.append(typed("query_seqlens", ["b"], TensorProto.INT32))
    graph = helper.make_graph([node], "windowed", inputs, [typed(n, None) for n in node.output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """Each held token's attention over the last WINDOW held tokens, with each head's sink."""
    rows = []
    for t in range(len(q)):
        heads = []
        for h in range(HEADS):
            g = h // (HEADS // KV_HEADS)
            keys, values = (x[max(0, t - WINDOW + 1):t + 1, g * HEAD:(g + 1) * HEAD] for x in (k, v))
            scores = keys @ q[t, h * HEAD:(h + 1) * HEAD] / math.sqrt(HEAD)
            top = max(scores.max(), sinks[h])
            weights = np.exp(scores - top)
            heads.append(weights @ values / (weights.sum() + np.exp(sinks[h] - top)))
        rows.append(np.concatenate(heads))
    return np.array(rows)


def resident(held: int) -> int:
    """The operator's L(T): how many of a row's last tokens its windowed buffer holds."""
    reclaimed = CAPACITY - WINDOW + 1
    return held if held <= CAPACITY else held - reclaimed * math.ceil((held - CAPACITY) / reclaimed)


def main() -> None:
    rng = np.random.default_rng(0)
    totals = [n + STEPS for n in LENGTHS]
    q, k, v = ([rng.standard_normal((n, heads * HEAD)).astype(np.float32) for n in totals]
               for heads in (HEADS, KV_HEADS, KV_HEADS))
    sinks = rng.standard_normal(HEADS).astype(np.float32)
    expected = [attention(q[b], k[b], v[b], sinks) for b in range(BATCH)]

    def right_padded(rows: list[np.ndarray]) -> np.ndarray:
        out = np.zeros((BATCH, CHUNK, rows[0].shape[1]), np.float32)
        for b, row in enumerate(rows):
            out[b, :len(row)] = row
        return out

    for query_seqlens in (False, True):
        run = session(query_seqlens)
        empty = np.zeros((BATCH, KV_HEADS, CAPACITY, HEAD), np.float32)
        feed = {"q": right_padded([x[:n] for x, n in zip(q, LENGTHS)]), "k": right_padded([x[:n] for x, n in zip(k, LENGTHS)]),
                "v": right_padded([x[:n] for x, n in zip(v, LENGTHS)]), "past_k": empty, "past_v": empty,
                "seqlens": np.array(LENGTHS, np.int32) - 1, "total": np.array(CHUNK, np.int32), "sinks": sinks}
        if query_seqlens:
            feed["query_seqlens"] = np.array(LENGTHS, np.int32)
        label = "with query_seqlens" if query_seqlens else "without query_seqlens"
        try:
            out, past_k, past_v = run.run(None, feed)
        except Exception as error:  # the refusal is the finding; reported, not hidden
            print(f"{label}: the right-padded prompt is refused: {str(error).splitlines()[0][-90:]}")
            continue
        worst = max(np.abs(out[b, :n] - expected[b][:n]).max() for b, n in enumerate(LENGTHS))
        held = list(LENGTHS)
        for _ in range(STEPS):
            feed = {"q": np.stack([q[b][held[b]:held[b] + 1] for b in range(BATCH)]),
                    "k": np.stack([k[b][held[b]:held[b] + 1] for b in range(BATCH)]),
                    "v": np.stack([v[b][held[b]:held[b] + 1] for b in range(BATCH)]),
                    "past_k": past_k, "past_v": past_v, "seqlens": np.array(held, np.int32),
                    "total": np.array(max(held) + 1, np.int32), "sinks": sinks}
            if query_seqlens:
                feed["query_seqlens"] = np.ones(BATCH, np.int32)
            out, past_k, past_v = run.run(None, feed)
            held = [n + 1 for n in held]
            worst = max(worst, *(np.abs(out[b, 0] - expected[b][n - 1]).max() for b, n in enumerate(held)))
            layout = max(np.abs(past_k[b, :, :resident(n)].transpose(1, 0, 2).reshape(resident(n), -1)
                                - k[b][n - resident(n):n]).max() for b, n in enumerate(held))
            if layout != 0:
                print(f"{label}: the buffer's layout differs from L(T) at held {held}")
        print(f"{label}: prompt and {STEPS} decode steps, largest difference {worst:.1e}; buffer {past_k.shape[2]} "
              f"slots for rows of {held} tokens")


if __name__ == "__main__":
    main()
