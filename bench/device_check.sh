#!/bin/bash
# Every generator's real train.py path on one GPU, then the speed benches on the quiet GPU.
#
#   bash bench/device_check.sh OUTDIR [cuda|cpu]      # PY=... to pick the interpreter (default .venv/bin/python)
#
# OUTDIR/summary.txt: one line a step (exit code, wall seconds) and each run's ε spent; OUTDIR/all.log: every
# output; OUTDIR/runs/NAME: the run folders. The trainings run AT ONCE on the one device (their walls are under
# that concurrency), each with its own throwaway budget registry, so the figures need no shared state. The
# benches then run one at a time. Figures of 2026-11-27 on an H200 are in docs/results.md, section `gpu`.
O=${1:?usage: bash bench/device_check.sh OUTDIR [cuda|cpu]}; DEV=${2:-cuda}
PY=${PY:-.venv/bin/python}; TLIM=${TLIM:-600}; BLIM=${BLIM:-300}
mkdir -p "$O/runs"; L=$O/all.log; S=$O/summary.txt
export PYTHONUNBUFFERED=1
step() {  # step NAME LIMIT LOG CMD...
  local name=$1 lim=$2 log=$3; shift 3
  echo "===== $name: $* ($(date -u +%T))" >>"$log"
  local t0 t1 rc; t0=$(date +%s.%N)
  timeout "$lim" "$@" >>"$log" 2>&1; rc=$?
  t1=$(date +%s.%N)
  printf '%-28s rc=%-3s wall=%6.1f s\n' "$name" "$rc" "$(awk "BEGIN{print $t1 - $t0}")" | tee -a "$S" >>"$log"
}
$PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')" >>"$S" 2>&1
ACC=gpu; [ "$DEV" = cpu ] && ACC=cpu
train() {  # train NAME OVERRIDES...
  local name=$1; shift
  LIGHTNING_DP_REGISTRY=sqlite:///$(realpath "$O")/runs/$name.sqlite step "train_$name" "$TLIM" "$O/runs/$name.log" \
    $PY train.py "$@" trainer.accelerator=$ACC output_dir="$O/runs/$name"
}
train dp_merf_adult experiment=dp_merf_adult &
train pearl_adult experiment=pearl_adult &
train gem_adult experiment=gem_adult &
train dp_cgan_adult experiment=dp_cgan_adult &
train dp_cgan_mnist experiment=dp_cgan_mnist &
train dp_merf_mnist experiment=dp_merf_mnist &
train mmd_gan_ae_adult model=mmd_gan_ae data=adult &
train ppem_adult experiment=ppem_adult &
wait
for f in "$O"/runs/*.log; do cat "$f" >>"$L"; done
for d in "$O"/runs/*/; do
  $PY -c "import json, sys; d = json.load(open(sys.argv[1] + '/ledger.json'))
print(f\"{sys.argv[2]:<28} ε {d['epsilon']:.4f} of {d['target_epsilon']}, {len(d['releases'])} releases\")" "$d" "$(basename "$d")" >>"$S" 2>&1
done
step bench_dp_sgd "$BLIM" "$L" $PY bench/dp_sgd.py --device "$DEV" --steps 30 --warmup 5
step bench_embedding "$BLIM" "$L" $PY bench/embedding.py --device "$DEV" --rows 10000000
step bench_pearl "$BLIM" "$L" $PY bench/pearl.py --device "$DEV" --steps 200
step bench_support_points "$BLIM" "$L" $PY bench/support_points.py --device "$DEV" --min-seconds 1 --steps 2000
step bench_gem_scaling "$BLIM" "$L" $PY bench/gem_scaling.py --device "$DEV" --rows 10000 100000 1000000 10000000 --columns 15 40 100
echo "done $(date -u +%T)" >>"$S"
