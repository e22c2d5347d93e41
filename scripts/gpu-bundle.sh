#!/usr/bin/env bash
# Builds the GPU checks here and packs them into one self-contained bundle for a bare GPU
# machine (issue 15): an NVIDIA driver, the CUDA 13 toolkit and PyTorch with NVIDIA's cuDNN
# and NCCL wheels, none of this project's Debian libraries, no network.
#
#   scripts/gpu-bundle.sh [--dry-run] [--build-dir DIR] --out DIR
#
# --out DIR receives two files:
#   zerotrain-gpu.tar.xz   bin/ (stripped test and benchmark binaries), lib/ (every shared
#                          library they load that such a machine lacks), bench/ (the PyTorch
#                          reference), run.sh (the runner)
#   run-gpu-checks.sh      unpacks the archive beside itself and runs it:
#                          `bash run-gpu-checks.sh RESULTS_DIR` on the GPU machine, one command
#                          that writes every log and figure to RESULTS_DIR and prints a summary.
# The device tool carries the --out folder (64 MiB at most: the archive is checked against it).
#
# --dry-run, for a machine with no GPU: packs, prints what the GPU run would run, then runs the
# CPU half here: the unpacked binaries start with only the bundle's libraries and the CUDA
# toolkit's (every GPU test skips with its reason), and the PyTorch reference smoke-runs on the
# CPU with Debian's torch.
#
# The build is its own (--build-dir, default build-gpu): CUDA required, and the CPU code built
# for x86-64-v3 (AVX2) instead of this machine's -march=native, since the binaries run on
# another machine's CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
log_prefix=gpu-bundle

usage() {
  sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}
fail() {
  echo "$log_prefix: $*" >&2
  exit 2
}

dry_run=0
out=
build_dir=build-gpu
while [[ $# -gt 0 ]]; do
  case $1 in
    --dry-run) dry_run=1 ;;
    --out) [[ $# -ge 2 ]] || fail "--out needs a directory"; out=$2; shift ;;
    --build-dir) [[ $# -ge 2 ]] || fail "--build-dir needs a directory"; build_dir=$2; shift ;;
    -h|--help) usage ;;
    *) fail "unknown argument '$1' (usage: scripts/gpu-bundle.sh [--dry-run] [--build-dir DIR] --out DIR)" ;;
  esac
  shift
done
[[ -n $out ]] || fail "--out DIR is required (where the bundle is written)"
scripts/install-deps.sh --gpu-bundle
nvcc=${CUDACXX:-/usr/local/cuda/bin/nvcc}
[[ -x $nvcc ]] || fail "no CUDA compiler at $nvcc (install the CUDA toolkit in /usr/local/cuda or set CUDACXX): the bundle's tests need CUDA"
for tool in xz strip ldd tar; do
  command -v "$tool" > /dev/null || fail "'$tool' is missing (apt-get install xz-utils binutils)"
done

# What the GPU machine runs: the GPU tests and every CUDA benchmark that exists.
targets=(gpu_test)
for src in bench/*cuda*_bench.cc; do
  [[ -e $src ]] && targets+=("$(basename "${src%.cc}")")
done

echo "$log_prefix: building ${targets[*]} in $build_dir (CUDA required, CPU code for x86-64-v3)"
launcher=()
if command -v ccache > /dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build_dir" -DZT_REQUIRE_CUDA=ON -DZT_CPU_ARCH=x86-64-v3 \
  -DCMAKE_CUDA_COMPILER="$nvcc" "${launcher[@]}" > "$build_dir.configure.log" 2>&1 ||
  { cat "$build_dir.configure.log"; fail "configure failed (log above)"; }
cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/zerotrain-gpu
mkdir -p "$root/bin" "$root/lib" "$root/bench"
binaries=()
for t in "${targets[@]}"; do
  path=$(find "$build_dir" -type f -name "$t" -perm -u+x | head -n1)
  [[ -n $path ]] || fail "built target $t but found no binary named $t under $build_dir"
  cp "$path" "$root/bin/$t"
  strip --strip-unneeded "$root/bin/$t"
  binaries+=("$root/bin/$t")
done

# Libraries the GPU machine provides itself, never packed: the C and C++ runtimes (a newer
# glibc and libstdc++ there run binaries built against Debian 12's), the driver, and the
# CUDA libraries of its own toolkit and PyTorch's NVIDIA wheels (the runner puts those first).
provided='^(linux-vdso|ld-linux[-a-z0-9_]*|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn[a-z_]*|libnvrtc|libnvJitLink)\.so'
declare -A packed=()
for bin in "${binaries[@]}"; do
  while read -r name path; do
    [[ $name =~ $provided ]] && continue
    [[ -n ${packed[$name]:-} ]] && continue
    [[ $path == /* && -f $path ]] || fail "$(basename "$bin") needs $name, which ldd cannot find here: $path"
    cp -L "$path" "$root/lib/$name"
    strip --strip-unneeded "$root/lib/$name" 2> /dev/null || true
    packed[$name]=1
  done < <(LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib ldd "$bin" |
             awk '/=>/ { print $1, $3 } !/=>/ && $1 ~ /^\// { n = $1; sub(/.*\//, "", n); print n, $1 }')
done

cp bench/pytorch_reference.py "$root/bench/"
cat > "$root/run.sh" <<'RUNNER'
#!/usr/bin/env bash
# Runs the GPU checks on this machine: `run.sh RESULTS_DIR [--dry-run]`. Writes gpu.txt (the
# device), gpu_test.log and gpu_test.xml, one log per benchmark, pytorch_*.json (the
# reference) and summary.txt, which it prints last. Exits 1 when a GPU test failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
results=${1:?usage: run.sh RESULTS_DIR [--dry-run]}
dry_run=${2:-}
mkdir -p "$results"
# The machine's own CUDA first, then PyTorch's NVIDIA wheels (cuDNN, NCCL), then the bundle.
cuda_libs=
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $d ]] && cuda_libs+=$d:
done
python=
for p in /opt/torch/.venv/bin/python3 /usr/bin/python3 python3; do
  if command -v "$p" > /dev/null && "$p" -c 'import torch' 2> /dev/null; then python=$p; break; fi
done
if [[ -n $python ]]; then
  for d in $("$python" - <<'PY'
import glob, os, site
dirs = []
for s in site.getsitepackages():
    dirs += sorted(glob.glob(os.path.join(s, "nvidia", "*", "lib")))
print("\n".join(dirs))
PY
); do cuda_libs+=$d:; done
fi
export LD_LIBRARY_PATH=${cuda_libs}$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -n) $(uname -r)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1 || echo "nvidia-smi: not available"
  echo "python: ${python:-none}"
  echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH"
} > "$results/gpu.txt" 2>&1
# What the binaries would fail to load here; run.sh's caller (and the dry run) checks it.
ldd "$here"/bin/* | grep 'not found' | sort -u > "$results/missing_libraries.txt" || true
{ echo "libraries still missing:"; cat "$results/missing_libraries.txt"; } >> "$results/gpu.txt"

status=0
"$here/bin/gpu_test" --gtest_output="xml:$results/gpu_test.xml" > "$results/gpu_test.log" 2>&1 || status=1
for b in "$here"/bin/*_bench; do
  [[ -e $b ]] || continue
  "$b" > "$results/$(basename "$b").log" 2>&1 || echo "$(basename "$b") exited $?" >> "$results/$(basename "$b").log"
done
if [[ -n $python ]]; then
  ref=("$python" "$here/bench/pytorch_reference.py" --family gpt2 --n-layer 12 --n-head 12
       --d-model 768 --vocab 50257 --max-seq-len 1024)
  if [[ $dry_run == --dry-run ]]; then
    # The CPU half: the reference's mixed-precision path on a tiny model on the CPU.
    "$python" "$here/bench/pytorch_reference.py" --family gpt2 --n-layer 2 --n-head 2 --d-model 64 \
      --vocab 256 --seq-len 32 --batch 2 --steps 2 --warmup-steps 1 --device cpu --precision bf16 \
      > "$results/pytorch_cpu_smoke.json" 2> "$results/pytorch_cpu_smoke.log" || status=1
  else
    for mode in eager compile; do
      for batch in 16 32; do
        flags=(--device cuda --precision bf16 --seq-len 1024 --batch "$batch" --steps 20 --warmup-steps 5)
        [[ $mode == compile ]] && flags+=(--compile)
        "${ref[@]}" "${flags[@]}" > "$results/pytorch_${mode}_b${batch}.json" \
          2> "$results/pytorch_${mode}_b${batch}.log" || echo "failed: see pytorch_${mode}_b${batch}.log" >> "$results/pytorch_${mode}_b${batch}.json"
      done
    done
  fi
fi

{
  count() {
    local n
    n=$(grep -Eo "^\[  $1 *\] [0-9]+ tests?" "$results/gpu_test.log" | grep -Eo '[0-9]+' | tail -n1)
    echo "${n:-0}"
  }
  echo "== GPU tests: $(count PASSED) passed, $(count FAILED) failed, $(count SKIPPED) skipped"
  grep -E '^\[  FAILED  \]' "$results/gpu_test.log" | sort -u | head -40 || true
  grep -m1 -E 'SKIPPED \]|no usable CUDA' "$results/gpu_test.log" | head -1 || true
  for f in "$results"/*_bench.log; do [[ -e $f ]] && { echo "== $(basename "$f")"; tail -n 15 "$f"; }; done
  for f in "$results"/pytorch_*.json; do [[ -e $f ]] && { echo "== $(basename "$f")"; cat "$f"; }; done
} > "$results/summary.txt"
cat "$results/summary.txt"
exit $status
RUNNER
chmod +x "$root/run.sh"

mkdir -p "$out"
out=$(cd "$out" && pwd)
tar -C "$stage" -cf - zerotrain-gpu | xz -T0 -6 > "$out/zerotrain-gpu.tar.xz"
cat > "$out/run-gpu-checks.sh" <<'LAUNCHER'
#!/usr/bin/env bash
# Unpacks zerotrain-gpu.tar.xz (beside this script) and runs its checks:
# `bash run-gpu-checks.sh RESULTS_DIR [--dry-run]`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
results=${1:?usage: run-gpu-checks.sh RESULTS_DIR [--dry-run]}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xJf "$here/zerotrain-gpu.tar.xz"
mkdir -p "$results"
bash "$work/zerotrain-gpu/run.sh" "$(cd "$results" && pwd)" "${2:-}"
LAUNCHER
chmod +x "$out/run-gpu-checks.sh"

bytes=$(stat -c %s "$out/zerotrain-gpu.tar.xz")
limit=$((64 * 1024 * 1024))
echo "$log_prefix: $out/zerotrain-gpu.tar.xz: $((bytes / 1024 / 1024)) MiB (${#packed[@]} libraries packed: ${!packed[*]})"
((bytes < limit)) || fail "the bundle is $bytes bytes, over the device tool's 64 MiB"

echo "$log_prefix: on the GPU machine this runs:"
echo "  bash $(basename "$out")/run-gpu-checks.sh \$OUT"
echo "    bin/gpu_test (every CUDA op against its CPU twin, the staged and NCCL communicators, CUDA arenas)"
for t in "${targets[@]:1}"; do echo "    bin/$t"; done
echo "    bench/pytorch_reference.py: GPT-2 124M, T 1024, bf16, batch 16 and 32, eager and torch.compile, fused AdamW"

if ((dry_run)); then
  echo "$log_prefix: dry run: the CPU half, here"
  results=$(mktemp -d)
  if bash "$out/run-gpu-checks.sh" "$results" --dry-run; then
    echo "$log_prefix: dry run passed (logs were in $results)"
  else
    cat "$results/gpu_test.log" "$results"/pytorch_cpu_smoke.log 2> /dev/null | tail -n 60
    fail "dry run failed (logs above, in $results)"
  fi
  if [[ -s $results/missing_libraries.txt ]]; then
    cat "$results/gpu.txt"
    fail "a packed binary misses a library (above)"
  fi
  grep -q 'SKIPPED\|PASSED' "$results/gpu_test.log" || fail "gpu_test printed neither PASSED nor SKIPPED"
fi
