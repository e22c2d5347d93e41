#!/usr/bin/env bash
# The NVMe swap store's bandwidth beside fio's (issue 16): on the same directory, with the
# same block size and queue depth, O_DIRECT and io_uring on both sides, sequential writes
# (flushed at the end) and then reads of a file of the same size.
#   - `zt offload probe` runs the store's own I/O engine (offload/io_engine.h) the way the
#     swap store writes and reads extents;
#   - fio (Debian's) is the reference: --ioengine=io_uring --direct=1 --bs --iodepth,
#     --end_fsync=1 for the writes (the store syncs its generation before the index commit).
# The bandwidth reached during training is in training_bench's JSON (swap bytes / the copy
# queue's seconds); bench/RESULTS.md puts it beside these.
#
# Usage: bench/run_swap_bandwidth_bench.sh BUILD_DIR DIR
# Environment (optional): BLOCK_SIZE bytes (default 1048576, offload.aio.block_size's
# default), QUEUE_DEPTH (default 8), BYTES per file (default 4294967296), ROUNDS (default 2;
# the two tools alternate, and every round is printed).
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR DIR" >&2
  exit 2
fi
zt_bin="$1/bin/zt"
dir=$2
if [[ ! -x $zt_bin ]]; then
  echo "$zt_bin is missing (build target zt)" >&2
  exit 2
fi
if ! command -v fio > /dev/null; then
  echo "fio is missing (scripts/install-deps.sh --bench installs it)" >&2
  exit 2
fi
if [[ ! -d $dir || ! -w $dir ]]; then
  echo "$dir is not a writable directory" >&2
  exit 2
fi
block_size=${BLOCK_SIZE:-1048576}
queue_depth=${QUEUE_DEPTH:-8}
bytes=${BYTES:-4294967296}
rounds=${ROUNDS:-2}
fio_dir=$(mktemp -d -p "$dir" zt_fio.XXXXXX)
trap 'rm -rf "$fio_dir"' EXIT

# One fio job; prints its bandwidth in GB/s (1e9 bytes/s), read from fio's JSON.
fio_gbps() {
  local rw=$1 field=$2
  fio --name=swap --directory="$fio_dir" --filename=swapfile --rw="$rw" --bs="$block_size" \
    --iodepth="$queue_depth" --ioengine=io_uring --direct=1 --size="$bytes" --end_fsync=1 \
    --output-format=json |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['$field']; print(f\"{j['io_bytes']/(j['runtime']/1000)/1e9:.3f}\")"
}

echo "block size $block_size, queue depth $queue_depth, $bytes bytes, $dir"
for round in $(seq 1 "$rounds"); do
  probe=$("$zt_bin" offload probe "$dir" --block-size "$block_size" --queue-depth "$queue_depth" \
    --bytes "$bytes" --json)
  echo "round $round zt offload probe: $probe"
  write=$(fio_gbps write write)
  read=$(fio_gbps read read)
  rm -f "$fio_dir/swapfile"
  echo "round $round fio: write $write GB/s, read $read GB/s"
done
