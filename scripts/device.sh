#!/usr/bin/env bash
# Run a stage on a GPU machine with no internet (the lent H200): install the offline wheels (Hydra,
# OmegaConf, W&B, built by shared/tools/offline-wheels.sh into .whl/), then one or more stages:
#   tests    build the CUDA extension, run the GPU tests and the fused methods' CPU-contract tests
#            (softmax, cross-entropy, attention; TEST_FILES, TEST_FILTER override which; TEST_ARGS adds
#            pytest options, e.g. "-m gpu -n 16 --dist worksteal" (the image has pytest-xdist; worksteal
#            spreads the largest GPU files, some 230 tests each, over the workers, where loadfile keeps each
#            whole in one worker)
#   kernels  python -m harness.bench kernels (full table; extra args in KERNEL_ARGS)
#   loss     python -m harness.bench loss (cross-entropy table; LOSS_ARGS)
#   attention  python -m harness.bench attention (attention table; ATTENTION_ARGS)
#            at the Llama-family models' shapes (grouped-query attention; the loss at their V and C too):
#            ATTENTION_ARGS="--models smollm2_135m,qwen25_05b,llama32_1b" LOSS_ARGS="--models smollm2_135m,qwen25_05b,llama32_1b"
#   launch   python -m harness.bench launch (host microseconds per call; LAUNCH_ARGS)
#   host-profile  python -m harness.bench host-profile (where the host time of a call goes, at benchmark
#            sizes; HOST_PROFILE_ARGS, e.g. "--methods flash,sdpa --shapes 16,12,1024,64 --layout bthd --trace")
#   sweep    python -m harness.bench triton-sweep (Triton launch settings per N; extra args in SWEEP_ARGS)
#   cuda-sweep  python -m harness.bench cuda-sweep (CUDA launch variants per N; CUDA_SWEEP_ARGS)
#   triton-ce-sweep  python -m harness.bench triton-ce-sweep (Triton cross-entropy plans per V; TRITON_CE_SWEEP_ARGS)
#   ce-sweep python -m harness.bench cuda-ce-sweep (CUDA cross-entropy launch variants per V; CE_SWEEP_ARGS)
#   flash-sweep  python -m harness.bench flash-sweep (flash attention plans per shape, SDPA flash and cuDNN
#            beside them; FLASH_SHAPES, FLASH_FWD_PHASES, FLASH_BWD_PHASES, FLASH_MODE (fwd, bwd, both) override
#            its --shapes, phases and --mode,
#            e.g. FLASH_SHAPES="4,12,4096,64" FLASH_BWD_PHASES="fused=0 dq_mode=pass,atomic,tma_add";
#            grouped heads as H:Hkv, e.g. FLASH_SHAPES="8,14:2,2048,64" FLASH_MODE=bwd FLASH_BWD_PHASES="one_loop=0,1")
#   overhead python -m harness.bench overhead model=gpt2s
#   study    python -m harness.study (STUDY_ARGS; or STUDIES, one line of arguments a study, run in turn, e.g. a
#            model and its Hugging Face twin on the same warm machine: STUDIES=$'model=qwen25_05b ...\nmodel=hf_qwen25_05b ...')
#   profile  Nsight Compute on scripts/profile_softmax.py (PROFILE_ARGS: method, N, direction; NCU_KERNEL:
#            kernel-name filter, default the fused methods' kernels; NCU_ARGS: launches and sections, see below)
#   profile-attention  Nsight Compute on scripts/profile_attention.py (ATTN_PROFILE_ARGS: method, shape,
#            direction; ATTN_FWD, ATTN_BWD: flash plan knobs, e.g. ATTN_FWD="gluon=2 overlap=1"; NCU_KERNEL,
#            default flash's kernels; NCU_ARGS as for profile: --launch-skip counts the warm-up call's launches)
# HARNESS_* switches pass through to every stage (HARNESS_FLASH_GLUON_GROUPED=1: grouped heads by flash's Gluon
# kernels; the tables and reports name the switches set).
# Logs and results go to $OUT (or outputs/device); the last lines printed are a short summary.
set -uo pipefail
OUT=${OUT:-outputs/device}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export WANDB_MODE=${WANDB_MODE:-offline} WANDB_SILENT=true PYTHONUNBUFFERED=1 HARNESS_CACHE=/tmp/harness-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
summary=()
for stage in "$@"; do
  t0=$(date +%s)
  # a stage's timings are only its own when nothing else runs on the GPU (a test run cut by its timeout can
  # leave pytest-xdist workers behind: the tests stage ends them below); say so where something does
  others=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null | tr '\n' ';')
  [ -n "$others" ] && { echo "WARNING: $stage begins with other processes on the GPU: $others"; summary+=("WARNING: $stage began beside $others"); }
  case $stage in
    tests)
      python3 -c "from kernels.methods import cuda as c; print('cuda extension:', c.prepare())" 2>&1 | tail -30 | tee "$OUT/build.log"
      # in a session of its own, so that pytest-xdist workers of a run stopped by its timeout end with it
      # (left running they would share the GPU and the host with the next stage's timings)
      setsid timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider ${TEST_ARGS:-} ${TEST_FILES:-tests/test_gpu_methods.py tests/test_triton_*.py \
        tests/test_cuda_cross_entropy.py tests/test_cross_entropy.py tests/test_flash_attention.py tests/test_flash_plans.py tests/test_flash_gluon.py \
        tests/test_flash_gluon_bwd.py tests/test_flash_gluon_compile.py tests/test_flash_loops.py tests/test_flex_attention.py \
        tests/test_attention_qkv.py tests/test_flash_gqa.py tests/test_gqa.py tests/test_linear_cross_entropy_compiled.py \
        tests/test_runtime_fastlaunch.py tests/test_launch_sites.py \
        tests/test_properties.py tests/test_kernels.py tests/test_registry.py tests/test_model.py} \
        -k "${TEST_FILTER:-triton or cuda or gpu or sdpa or compiled}" > "$OUT/tests.log" 2>&1 &
      tests_pid=$!
      wait $tests_pid
      kill -9 -- -$tests_pid 2>/dev/null
      tail -40 "$OUT/tests.log"
      summary+=("tests: $(tail -1 "$OUT/tests.log")")
      ;;
    kernels)
      timeout ${KERNEL_TIMEOUT:-400} python3 -m harness.bench kernels --out "$OUT" ${KERNEL_ARGS:-} 2>&1 | tee "$OUT/kernels.log" | grep -v "^|" | tail -60
      summary+=("kernels: see $OUT/kernels.md")
      ;;
    loss|attention|launch)
      var="$(echo "$stage" | tr a-z A-Z)_ARGS"
      timeout ${BENCH_TIMEOUT:-300} python3 -m harness.bench "$stage" --out "$OUT" ${!var:-} 2>&1 | tee "$OUT/$stage.log" | grep -v "^|" | tail -40
      summary+=("$stage: see $OUT/$stage.md")
      ;;
    host-profile)
      timeout ${BENCH_TIMEOUT:-300} python3 -m harness.bench host-profile --out "$OUT" ${HOST_PROFILE_ARGS:-} 2>&1 \
        | grep -v "USDT" | tee "$OUT/host_profile.log" | grep -v "^|" | tail -30
      summary+=("host-profile: see $OUT/host_profile.md")
      ;;
    sweep)
      timeout ${SWEEP_TIMEOUT:-240} python3 -m harness.bench triton-sweep --out "$OUT" ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/sweep.log" | grep -E "^N=|Error" | tail -20
      summary+=("sweep: see $OUT/triton_sweep.json")
      ;;
    cuda-sweep)
      timeout ${CUDA_SWEEP_TIMEOUT:-300} python3 -m harness.bench cuda-sweep --out "$OUT" ${CUDA_SWEEP_ARGS:-} 2>&1 | tee "$OUT/cuda_sweep.log" | grep -E "^N=|^cuda-sweep|Error" | tail -20
      summary+=("cuda-sweep: see $OUT/cuda_sweep.json")
      ;;
    triton-ce-sweep)
      timeout ${TRITON_CE_SWEEP_TIMEOUT:-300} python3 -m harness.bench triton-ce-sweep --out "$OUT" ${TRITON_CE_SWEEP_ARGS:-} 2>&1 | tee "$OUT/triton_ce_sweep.log" | grep -E "best|current|Error" | tail -30
      summary+=("triton-ce-sweep: see $OUT/triton_ce_sweep.json")
      ;;
    ce-sweep)
      timeout ${CE_SWEEP_TIMEOUT:-300} python3 -m harness.bench cuda-ce-sweep --out "$OUT" ${CE_SWEEP_ARGS:-} 2>&1 | tee "$OUT/ce_sweep.log" | grep -E "^V=|best|^ce-sweep|WRONG|Error" | tail -30
      summary+=("ce-sweep: see $OUT/ce_sweep.json")
      ;;
    flash-sweep)
      args=(--out "$OUT/flash_sweep.json" --max-seconds $(( ${FLASH_SWEEP_TIMEOUT:-400} - 30 )))
      [ -n "${FLASH_SHAPES:-}" ] && args+=(--shapes "$FLASH_SHAPES")
      [ -n "${FLASH_FWD_PHASES:-}" ] && args+=(--fwd-phases "$FLASH_FWD_PHASES")
      [ -n "${FLASH_BWD_PHASES:-}" ] && args+=(--bwd-phases "$FLASH_BWD_PHASES")
      [ -n "${FLASH_MODE:-}" ] && args+=(--mode "$FLASH_MODE")
      timeout ${FLASH_SWEEP_TIMEOUT:-400} python3 -m harness.bench flash-sweep "${args[@]}" 2>&1 | tee "$OUT/flash_sweep.log" \
        | grep -E "^==|sdpa-|table entry|\*$|FAILED|WRONG" | cut -c1-220 | tail -40
      summary+=("flash-sweep: see $OUT/flash_sweep.json")
      ;;
    overhead)
      timeout ${OVERHEAD_TIMEOUT:-300} python3 -m harness.bench overhead --out "$OUT/overhead" ${OVERHEAD_ARGS:-model=gpt2s} 2>&1 | tee "$OUT/overhead.log" | grep -E "round|harness /|Error|error" | tail -20
      summary+=("overhead: $(grep 'harness / bare' "$OUT/overhead.log" | tail -1)")
      ;;
    study)
      # STUDIES: several studies in one call, one line of arguments each (study_1, study_2, ... in $OUT),
      # each given STUDY_TIMEOUT; else the one study of STUDY_ARGS (study in $OUT)
      i=0
      while IFS= read -r args; do
        [ -z "${args// }" ] && [ -n "${STUDIES:-}" ] && continue  # (no STUDY_ARGS either: the default study)
        i=$((i + 1)); dir=study; [ -n "${STUDIES:-}" ] && dir=study_$i
        set -f  # (Hydra's list overrides, e.g. study.methods=[a,b], are not file globs)
        timeout ${STUDY_TIMEOUT:-500} python3 -m harness.study $args hydra.run.dir="$OUT/$dir" 2>&1 | tee "$OUT/$dir.log" | tail -40
        rc=${PIPESTATUS[0]}
        set +f
        summary+=("$dir ($args): exit $rc, see $OUT/$dir/report.md")
      done <<< "${STUDIES:-${STUDY_ARGS:-}}"
      ;;
    profile)
      timeout ${PROFILE_TIMEOUT:-300} ncu --clock-control none -k "${NCU_KERNEL:-regex:(fwd|bwd)_[a-z]+_kernel}" \
        ${NCU_ARGS:---launch-skip 2 --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats} \
        python3 scripts/profile_softmax.py ${PROFILE_ARGS:-} > "$OUT/ncu.txt" 2>&1
      grep -E "path:|  [a-z_]*kernel|Duration|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|==ERR|==PROF==" "$OUT/ncu.txt" | tail -40
      summary+=("profile: see $OUT/ncu.txt")
      ;;
    profile-attention)
      timeout ${PROFILE_TIMEOUT:-300} ncu --clock-control none -k "${NCU_KERNEL:-regex:_(fwd|bwd|dkdv|dq|delta)[a-z_]*kernel}" \
        ${NCU_ARGS:---launch-skip 1 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats} \
        python3 scripts/profile_attention.py ${ATTN_PROFILE_ARGS:-} --fwd "${ATTN_FWD:-}" --bwd "${ATTN_BWD:-}" \
        > "$OUT/ncu_attention.txt" 2>&1
      grep -E "plans:|  [A-Za-z_]*kernel|Duration|Compute \(SM\) Throughput|Issue Slots Busy|Achieved Occupancy|Warp Cycles Per Issued|==ERR|==PROF==" \
        "$OUT/ncu_attention.txt" | tail -40
      summary+=("profile-attention: see $OUT/ncu_attention.txt")
      ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  summary+=("  ($stage took $(( $(date +%s) - t0 )) s)")
done
echo "==== summary"
printf '%s\n' "${summary[@]}"
