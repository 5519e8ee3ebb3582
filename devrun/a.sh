# call 9: capture cost with its in-loop parts, and the reduction kernel at SmolLM2's shape
source /root/stage/env.sh
nvidia-smi --query-gpu=name,memory.used --format=csv
python benchmarks/kept_set_reduce.py --rows 256 --vocab 49152 2>&1 | tail -6 | tee $OUT/reduce.txt
timeout 420 python benchmarks/rollout_capture.py --models smollm2 --top-k 0 --modes off sampler --prompts 32 --n 8 \
  --max-new-tokens 512 --fixed-length --repeats 2 --gpu-mem 0.5 --profile --workdir /tmp/rc 2>&1 | tail -25 | tee $OUT/capture.txt
