"""One sha256 over what the fixed-decay and no-decay paths compute: the kernel's outputs, final
states, normaliser parts and gradients (T = 1, 63, 5,000; every feature map; with and without
decay) and the shipped default model's outputs and final state over a FASTA record and through
`forward_records`. Run it under two checkouts (PYTHONPATH=SITE of a `pip install --no-deps
--target SITE` of one) to show they compute the same bytes.

    python benchmarks/outputs_digest.py FASTA
"""
import hashlib
import sys

import torch

import linpipe
from linpipe.inputs.alphabet import tokenize
from linpipe.kernels import chunk_linear_attn, chunk_linear_attn_parts


def kernel_bytes(h) -> None:
    g = torch.Generator().manual_seed(0)
    for T in (1, 63, 5000):
        for fm in ("elu1", "relu", "identity"):
            for decay in (None, torch.tensor([0.9, 0.999, 1.0])):
                q, k, v = (torch.randn(2, T, 3, 16, generator=g) for _ in range(3))
                init = (torch.rand(2, 3, 16, 16, generator=g), torch.rand(2, 3, 16, generator=g) + 1)
                with torch.inference_mode():
                    o, (S, z) = chunk_linear_attn(q, k, v, decay=decay, feature_map=fm, initial_state=init,
                                                  output_final_state=True)
                num, den, (S2, z2) = chunk_linear_attn_parts(q, k, v, decay=decay, feature_map=fm,
                                                             initial_state=init)
                qq = q.clone().requires_grad_(True)
                o2, _ = chunk_linear_attn(qq, k, v, decay=decay, feature_map=fm, initial_state=init)
                o2.sum().backward()
                for t in (o, S, z, num, den, S2, z2, o2.detach(), qq.grad):
                    h.update(t.contiguous().numpy().tobytes())


def main() -> None:
    torch.set_num_threads(1)
    h = hashlib.sha256()
    kernel_bytes(h)
    seq = "".join(line.strip() for line in open(sys.argv[1]) if not line.startswith(">"))
    m = linpipe.load_model("default")
    out, state = m.forward(tokenize(seq), m.init_state())
    for k in sorted(out):
        h.update(out[k].tobytes())
    for _, v in sorted(state.to_arrays().items()):
        h.update(v.tobytes())
    for r in m.forward_records([tokenize(seq[:300]), tokenize(seq[:1000])]):
        for k in sorted(r):
            h.update(r[k].tobytes())
    print(h.hexdigest())


if __name__ == "__main__":
    main()
