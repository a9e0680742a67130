#!/usr/bin/env bash
# Runs the backend's chips on a host's GPU (TPUTRACE_PLATFORM=gpu) with that host's own torch and jax:
# versions, a smoke test in both eager modes, the matmul-bound planted problems before/after their fix
# at a size that suits the accelerator, the GPT example's step in each eager mode, and bench/eager_modes.py.
# Used on a lent GPU machine:
#     OUT=/some/dir [PARTS="smoke quickstart problems gpt eager"] bash bench/accelerator_check.sh [SCALE]
# Writes log.txt, the traces and the RESULTS.md its benchmarks updated under $OUT.
set -u -o pipefail
SCALE=${1:-8}
PARTS=" ${PARTS:-smoke quickstart problems gpt eager} "
want() { [[ "$PARTS" == *" $1 "* ]]; }
OUT=${OUT:-/tmp/tputrace-accelerator}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 TPUTRACE_PLATFORM=${TPUTRACE_PLATFORM:-gpu}
PYTHON=${PYTHON:-python3}

# A copy of the repository with its folders under their installed names (tputrace.backend, ...), run
# from there, so that nothing is installed and the checkout's own tputrace/ cannot shadow the package.
work=$(mktemp -d)
cp -r tputrace examples bench "$work/"
for folder in backend tui viewers; do cp -r "$folder" "$work/tputrace/$folder"; done
cd "$work" || exit 1
export PYTHONPATH="$work${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi -L || true
"$PYTHON" - <<'PY'
import jax, torch
print("python torch", torch.__version__, "jax", jax.__version__, "devices", jax.devices())
PY

want smoke && echo "== smoke" && { timeout 240 "$PYTHON" - <<'PY' || exit 1; }
import time
import torch
import tputrace.backend  # noqa: F401
print(torch.tpu.get_device_name(), torch.tpu.device_count())
for mode in (torch.tpu.EagerMode.DEFER_NEVER, torch.tpu.EagerMode.DEFER_AND_FUSE):
    torch.tpu.set_eager_mode(mode)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    reference = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    reference.load_state_dict(model.state_dict())
    model.to("tpu")
    inputs = torch.randn(32, 64)
    start = time.perf_counter()
    loss = model(inputs.to("tpu")).square().mean()
    loss.backward()
    expected = reference(inputs).square().mean()
    expected.backward()
    grads_match = all(torch.allclose(a.grad.cpu(), b.grad, atol=1e-4) for a, b in zip(model.parameters(), reference.parameters()))
    print(mode.name, "loss", loss.item(), "cpu", expected.item(), "grads match", grads_match,
          f"{time.perf_counter() - start:.2f} s")
PY

if want quickstart; then
    echo "== quickstart"
    timeout 240 "$PYTHON" -m tputrace.cli.main run -o "$OUT/quickstart.tptrace" examples/quickstart.py || echo "quickstart failed: $?"
fi

if want problems; then
    echo "== problems"
    timeout 420 "$PYTHON" bench/problems.py --platform "$TPUTRACE_PLATFORM" --scale "$SCALE" --only fp32_matmul tile_padding \
        --steps 8 --repeat 2 || echo "problems failed: $?"
    cp bench/RESULTS.md "$OUT/RESULTS.md"
fi

if want gpt; then
    for mode in defer strict; do
        echo "== gpt_train --mode $mode"
        timeout 240 "$PYTHON" -m tputrace.cli.main run --mode "$mode" -o "$OUT/gpt-$mode.tptrace" examples/gpt_train.py \
            --steps "${GPT_STEPS:-15}" 2>&1 | grep -E "^(run|wall) " || echo "gpt_train --mode $mode failed: $?"
    done
fi

if want eager; then
    echo "== eager modes"
    timeout "${EAGER_TIMEOUT:-240}" "$PYTHON" bench/eager_modes.py --steps 5 --rounds 2 || echo "eager_modes failed: $?"
    cp bench/RESULTS.md "$OUT/RESULTS.md"
fi
