# call 10: GPU tests (store-based trainer start, uint16 drain)
source /root/stage/env.sh
timeout 540 python -m pytest -m gpu -q -x -p no:cacheprovider tests/test_kept_set_gpu.py tests/test_vllm_gpu.py 2>&1 | tail -30 | tee $OUT/gputests.txt
