#!/bin/sh
# Issue 11's proof on a GPU host without systemd: the GPU smoke workload unconfined, then under the syscall
# sandbox of the unit before and after issue 11 (docs/h200/unit-*.service, applied by seccomp_harness.py), then
# once more under the new unit with refused calls only logged, so the kernel's audit log lists every call the
# workload makes outside the allow list. Run from the repository root as root (dmesg): docs/h200/proof.sh OUTDIR
set -u
out=${1:?usage: docs/h200/proof.sh OUTDIR}
py=${PYTHON:-python3}
harness=provision/verify/seccomp_harness.py
smoke=provision/verify/gpu_smoke.py
log=$out/harness.log
{
  echo "== machine"
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  uname -r; grep PRETTY_NAME /etc/os-release
  $py -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "nccl", torch.cuda.nccl.version())'
  ldconfig -p | grep libseccomp.so
  id
  echo "yama ptrace_scope: $(cat /proc/sys/kernel/yama/ptrace_scope 2>&1)"
  echo "seccomp actions_logged: $(cat /proc/sys/kernel/seccomp/actions_logged 2>&1)"
} >>"$log" 2>&1
dmesg -C
for run in unconfined before after after-log; do
  echo "== $run" >>"$log"
  case $run in
    unconfined) set -- ;;
    after-log) set -- "$py" "$harness" docs/h200/unit-after.service --default-action log -- ;;
    *) set -- "$py" "$harness" "docs/h200/unit-$run.service" -- ;;
  esac
  start=$(date +%s)
  "$@" "$py" "$smoke" --timeout 150 --json-out "$out/smoke-$run.json" >/dev/null 2>>"$log"
  echo "exit $? after $(( $(date +%s) - start )) s" >>"$log"
  # the audit records of this run only (type 1326: seccomp), then a clean log for the next
  dmesg | grep 'type=1326' | sed "s/^/$run: /" >>"$out/dmesg.txt"
  dmesg -C
done
echo "== done" >>"$log"
