# grpo_step: $1 = bench, rest = runs; keep logs/metrics in $OUT
source /root/stage/env.sh
bench=$1; shift
timeout ${T:-560} python benchmarks/grpo_step.py --out /root/gs --bench $bench --only "$@" --steps ${STEPS:-6} --timeout ${RUN_T:-250} 2>&1 | tail -20
python benchmarks/grpo_step.py --out /root/gs --bench smol qwen06b --only ours ours_compiled trl --report 2>&1 | tail -12 | tee $OUT/gs_report.txt
grep -h "rollout worker\|asleep" /root/gs/*/train.log 2>/dev/null | tail -30 > $OUT/worker_lines.txt
tar czf $OUT/gs.tgz -C /root gs --exclude='*.pt' --exclude='checkpoints' --exclude='*.safetensors' --exclude='rollouts*' 2>/dev/null; ls -la $OUT
