#!/usr/bin/env bash
# Write an ImageNet-layout data set (TRAIN_DIR/<class>/*.JPEG, VAL_DIR/<class>/*.JPEG) to FFCV files
# with the published settings: proportion mode, longest side 500, JPEG with probability 0.50,
# quality 90. Override with MAX_RESOLUTION, COMPRESS_PROBABILITY, JPEG_QUALITY, WORKERS.
#   scripts/write_imagenet.sh /data/imagenet/train /data/imagenet/val /data/ffcv
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 TRAIN_DIR VAL_DIR OUT_DIR" >&2
  exit 2
fi
train_dir=$1 val_dir=$2 out_dir=$3
resolution=${MAX_RESOLUTION:-500}
probability=${COMPRESS_PROBABILITY:-0.50}
quality=${JPEG_QUALITY:-90}
workers=${WORKERS:-$(nproc)}
trainrun=${TRAINRUN:-trainrun}
mkdir -p "$out_dir"
for split in train val; do
  source_dir=$train_dir
  [ "$split" = val ] && source_dir=$val_dir
  "$trainrun" write "$source_dir" "$out_dir/${split}_${resolution}_${probability}_${quality}.beton" \
    --mode proportion --max-resolution "$resolution" --compress-probability "$probability" \
    --jpeg-quality "$quality" --workers "$workers"
done
echo "train with: trainrun data=imagenet_ffcv data.train=$out_dir/train_${resolution}_${probability}_${quality}.beton" \
  "data.val=$out_dir/val_${resolution}_${probability}_${quality}.beton"
