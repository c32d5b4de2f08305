#!/usr/bin/env bash
# The checks that need a GPU (run where one is; nothing here runs in CI). Writes under $OUT
# (default benchmarks/results/gpu): env.txt, gpt_throughput.md, agreement.md, runs.tar.gz,
# pipeline_emulation_gpu.md, gpt2_small_bf16.md and check.log.
#
# 1. tokens/s of every GPT preset's synchronous AdamW step, the gpu preset (12 x 768) included;
# 2. whether a cell is a function of its configuration on a GPU: the same LM pipeline cells
#    (gpt-tiny on the embedded corpus, N = 2, sync / vanilla / stash, 2 seeds) computed twice as
#    vmapped lanes (the experiments ask XLA for deterministic GPU ops: experiments/__init__.py),
#    once one run at a time, once without deterministic ops, once at float32 matmul precision
#    ("highest", no TF32), and on the CPU of the same machine; benchmarks/_gpu_compare.py
#    tabulates each against the first GPU run, then against the CPU run;
# 3. the pipeline emulator's round of the gpu preset at N = 12 (one block per stage) against
#    its synchronous step, with XLA's memory analysis;
# 4. GPT-2 small (gpt2-small, 163 M parameters with its separate head) in bfloat16 at 8 x 1024
#    tokens: the synchronous AdamW step and the emulator's rounds (vanilla, stash, 2BW) at N = 8,
#    tokens/s, MFU against the device's bf16 peak (jaxstale.flops), carried state and XLA's
#    temporaries (issue 54; prepared on the CPU at small sizes, not yet run on a GPU).
#
# Each step gets what is left of DEADLINE seconds (default 480) and is cut off past it; STEPS
# picks the steps (default 1234: STEPS=4 runs GPT-2 small's alone).
# Usage: OUT=/some/dir PY=python3 DEADLINE=480 STEPS=1234 bash benchmarks/gpu_check.sh
# (On the lent H200 of 2026-11-27, jax 0.11.2 with CUDA 13: flax 0.12.8 does not import with
# that jax — its nnx needs a newer jax.experimental.hijax — and the machine's flax 0.12.10 ran.)
set -u
DEADLINE=${DEADLINE:-480}
STEPS=${STEPS:-1234}
want() { [[ $STEPS == *$1* ]]; }
left() { local l=$((DEADLINE - SECONDS)); echo $((l < $1 ? (l > 1 ? l : 1) : $1)); }
OUT=${OUT:-benchmarks/results/gpu}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
mkdir -p "$OUT"
exec > >(tee -a "$OUT/check.log") 2>&1
step() { echo; echo "=== $* ($(date +%T))"; }

step environment
{
  nvidia-smi -L
  $PY -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__,
'optax', optax.__version__); print(jax.devices())"
} | tee "$OUT/env.txt"

want 1 && step "1. GPT step throughput" &&
timeout "$(left 120)" $PY benchmarks/gpt_throughput.py --run-gpu --out "$OUT"

if want 2; then
step "2. the same cells, computed six ways"
RUNS=$(mktemp -d)
A=(--dataset shakespeare --model gpt-tiny --stages 2 --steps 40 --seeds 2 --lrs 0.003
   --methods sync vanilla stash --optimizer adamw --extend-edges 0 --eval-every 20)
run() { local name=$1; shift; timeout "$(left 70)" $PY -m experiments.pipeline_staleness "${A[@]}" "$@" \
  --out "$RUNS/$name" > "$RUNS/$name.log" 2>&1; echo "$name: exit $?"; }
run gpu-vmapped
run gpu-vmapped-again
run gpu-sequential --seed-mode sequential
XLA_FLAGS=--xla_gpu_deterministic_ops=false run gpu-nondeterministic
JAX_DEFAULT_MATMUL_PRECISION=highest run gpu-highest
JAX_PLATFORMS=cpu run cpu
$PY benchmarks/_gpu_compare.py "$RUNS"/gpu-vmapped "$RUNS"/gpu-vmapped-again \
  "$RUNS"/gpu-sequential "$RUNS"/gpu-nondeterministic "$RUNS"/gpu-highest "$RUNS"/cpu \
  --out "$OUT/agreement.md"
$PY benchmarks/_gpu_compare.py "$RUNS"/cpu "$RUNS"/gpu-highest "$RUNS"/gpu-vmapped \
  --out "$OUT/agreement-cpu.md"
tar -czf "$OUT/runs.tar.gz" -C "$RUNS" .
fi

want 3 && step "3. pipeline emulator round, gpu preset, N = 12" &&
timeout "$(left 300)" $PY benchmarks/pipeline_emulation.py --model gpt-gpu --stages 12 --batch 16 \
  --reps 3 --rounds 4 --backward saved --policies vanilla,stash --optimizer adamw \
  | tee "$OUT/pipeline_emulation_gpu.md"

want 4 && step "4. GPT-2 small in bfloat16, 8 x 1024 tokens, N = 8" &&
timeout "$(left 240)" $PY benchmarks/pipeline_emulation.py --model gpt2-small --context 1024 \
  --vocab 50304 --precision bfloat16 --stages 8 --batch 8 --reps 3 --rounds 4 --backward saved \
  --policies vanilla,stash,2bw --optimizer adamw | tee "$OUT/gpt2_small_bf16.md"
step done
