#!/usr/bin/env bash
# Usage: [GPUS=8 GPUS_PER_NODE=8 CPUS_PER_TASK=10 SRUN_ARGS=...] \
#        tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args]
# The arguments of mmpretrain's tools/slurm_train.sh. CPUS_PER_TASK: cores per GPU, for the
# pretraining configs' 8 data workers, the training process and its pin-memory thread.
set -x

PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-10}
SRUN_ARGS=${SRUN_ARGS:-""}
PY_ARGS=${@:5}

PYTHONPATH="$(dirname "$0")/..":$PYTHONPATH \
srun -p "${PARTITION}" \
    --job-name="${JOB_NAME}" \
    --gres=gpu:"${GPUS_PER_NODE}" \
    --ntasks="${GPUS}" \
    --ntasks-per-node="${GPUS_PER_NODE}" \
    --cpus-per-task="${CPUS_PER_TASK}" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    python -u "$(dirname "$0")/train.py" "${CONFIG}" --work-dir="${WORK_DIR}" --launcher="slurm" ${PY_ARGS}
