#!/usr/bin/env bash
# lm-evaluation-harness against `draftwise serve`, speculation off and on: the two local tasks in
# scripts/lm_eval_tasks (draftwise_mc: loglikelihood multiple choice; draftwise_gen: generate_until),
# through lm-eval's local-completions model with the server's own tokenizer (/tokenize, /tokenizer_info).
# Usage: scripts/lm_eval_check.sh [TARGET] [DRAFT]   (default: the default pair; needs `pip install 'lm-eval[api]==0.4.13'`)
# Prints each run's scores; the loglikelihood scores must be identical, generate_until equal but for near-ties.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
TARGET=${1:-qwen2.5-coder-1.5b-instruct}
DRAFT=${2:-ngram,qwen2.5-coder-0.5b-instruct}
OUT=${OUT:-/tmp/draftwise-lm-eval}
mkdir -p "$OUT"
for mode in off on; do
  port=$((18000 + RANDOM % 1000))
  if [ "$mode" = off ]; then draft=none; else draft=$DRAFT; fi
  draftwise serve --target "$TARGET" --draft "$draft" --policy fixed --port "$port" --parallel 1 \
    > "$OUT/serve-$mode.log" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null || true' EXIT
  for _ in $(seq 600); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 1; done
  (cd scripts/lm_eval_tasks && lm_eval --model local-completions \
     --model_args "base_url=http://127.0.0.1:$port/v1/completions,model=$TARGET,tokenizer_backend=remote,num_concurrent=1,max_retries=1,tokenized_requests=True" \
     --tasks draftwise_mc,draftwise_gen --include_path . --output_path "$OUT/$mode" --log_samples) \
     | tee "$OUT/lm-eval-$mode.txt"
  kill $pid; wait $pid 2>/dev/null || true
done
echo "results: $OUT/lm-eval-off.txt $OUT/lm-eval-on.txt"
