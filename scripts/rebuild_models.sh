#!/usr/bin/env bash
# Rebuilds every shipped model of cinq/assets from the Debian-package corpus, in dependency order: the corpus,
# the teacher (cinq-tiny), then what is distilled from it (the student and the three speculative heads, which
# are bound to the teacher's weights and must be retrained with it). Each run checkpoints into runs/ and resumes
# when the script is run again; a finished run is not repeated. About 2.5 hours of one core on a 2-core CPU.
#   bash scripts/rebuild_models.sh            # everything
#   bash scripts/rebuild_models.sh heads      # only the heads (the teacher already shipped)
set -euo pipefail
cd "$(dirname "$0")/.."
CINQ=${CINQ:-.venv/bin/cinq}
ONLY=${1:-all}
finished() { [ -f "$1/summary.json" ] && grep -q '"finished": true' "$1/summary.json"; }

if [ "$ONLY" = all ]; then
  [ -f data/corpus/manifest.json ] || $CINQ data build --out data/corpus --install --tokenizer cinq/assets/tokenizer
  finished runs/teacher || $CINQ train --data data/corpus --out runs/teacher --config cinq-tiny --tokens 6.4e6 \
    --batch-size 8 --seq-len 512 --lr 2e-3 --warmup 100 --decay-frac 0.3 --ckpt-every 240 --threads 1 \
    --no-progress --export cinq/assets/cinq-tiny
  finished runs/student-kd || $CINQ distill --teacher cinq/assets/cinq-tiny --student cinq-tiny-student \
    --data data/corpus --out runs/student-kd --loss fkl --tokens 2e6 --threads 1 --no-progress \
    --name 'KD fkl (off-policy)' --export cinq/assets/cinq-tiny-student
fi
heads() {  # METHOD TOKENS [extra flags]
  local method=$1 tokens=$2; shift 2
  finished "runs/head-$method" || $CINQ distill --heads "$method" --out "runs/head-$method" --tokens "$tokens" \
    --target cinq/assets/cinq-tiny --data data/corpus --train-prompts 2200 --eval-prompts 220 \
    --sample-temperature 0 --generated runs/spec-data --batch-size 16 --warmup 20 --lr 3e-3 --eval-every 50 \
    --threads 1 --no-progress "$@" --export "cinq/assets/cinq-tiny-$method"
}
heads eagle 9e5
heads eagle3 4e5
heads medusa 4.5e5 --medusa-lm-head target
