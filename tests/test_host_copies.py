"""A unit's outputs leaving a CUDA device (jobs/overlap.py, HostCopies): cast there to the store's
dtype, copied on a stream of their own into pinned host buffers that later units reuse, so the
copy of unit n overlaps the model's run of unit n+1. On a real genome, three units run back to
back before any of their outputs is read, then compared with Model.forward's on the same device.
Needs a CUDA device (skipped without one); the GPU checklist runs it
(benchmarks/gpu_checklist.sh, item 2). The CPU side of HostCopies: tests/test_overlap.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

OUTPUTS = ["logprob", "entropy", "hidden"]


def test_units_copied_through_pinned_buffers_are_the_models_outputs_and_states(genomes, tmp_path):
    from linpipe.inputs import open_input
    from linpipe.jobs.overlap import HostCopies
    from linpipe.model import ModelConfig, init_net, load_model, save_model

    cfg = ModelConfig(modality="dna", d_model=32, n_layers=2, n_heads=2, mlp_hidden=64)
    save_model(init_net(cfg, seed=0), cfg, tmp_path / "model")
    model = load_model(tmp_path / "model", device="cuda")
    host = HostCopies(model)
    assert host.enabled
    inp = open_input(str(genomes / "minimap2_MT-human.fa"))
    rid = inp.records[0].id
    bounds = [(0, 5000), (5000, 10000), (10000, 11234)]  # the last unit shorter: a view of a reused buffer
    units = [inp.read(rid, s, e)[0] for s, e in bounds]

    runs, state = [], model.init_state()
    for x in units:  # nothing read back until all three ran: their copies overlap the next runs
        out, state = host.forward(x, state, OUTPUTS, {"hidden": "float16"})
        runs.append(out)
    want, want_state = [], model.init_state()
    for x in units:
        w, want_state = model.forward(x, want_state, outputs=OUTPUTS)
        want.append((w, want_state.to_arrays()))

    for out, (w, w_state) in zip(runs, want, strict=True):
        got = out.arrays()
        assert got["hidden"].dtype == np.float16  # cast on the device, as the store keeps it
        assert got["hidden"].tobytes() == w["hidden"].astype(np.float16).tobytes()
        for k in ("logprob", "entropy"):
            assert got[k].shape == w[k].shape
            np.testing.assert_array_equal(got[k], w[k])
        for k, v in w_state.items():  # the boundary state the store keeps after the unit
            np.testing.assert_array_equal(out.state_arrays()[k], v)
        assert all(b.is_pinned() for b in out.buffers)
        out.release()
    # the buffers came back, and the next unit takes its own from them: no new pinned memory
    pooled = {id(b) for b in host.pooled()}
    again, _ = host.forward(units[2], state, OUTPUTS, {"hidden": "float16"})
    assert again.buffers and {id(b) for b in again.buffers} <= pooled
    assert again.arrays()["logprob"].shape == want[2][0]["logprob"].shape
    again.release()
