# learn_real seeds: $@ = extra args
source /root/stage/env.sh
timeout ${T:-570} python benchmarks/learn_real.py --out /root/lr --steps 50 "$@" 2>&1 | tail -10
python benchmarks/learn_real.py --report --out /root/lr 2>&1 | tail -10 | tee $OUT/lr_report.txt
tar czf $OUT/lr.tgz -C /root lr --exclude='*.pt' --exclude='checkpoints' --exclude='*.safetensors' --exclude='rollouts' 2>/dev/null; ls -la $OUT
