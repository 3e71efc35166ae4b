# Writes the seed corpus of the fuzzers from the committed fixtures (stdlib only):
#   fuzz/corpus/fuzz_safetensors/  every small safetensors file of tests/fixtures/peft_extra
#   fuzz/corpus/fuzz_adapter/      each adapter of tests/fixtures/peft_extra and peft_tokens (and
#                                  the base models) in fuzz_adapter.c's input format
# Run from the repo root: python3 fuzz/make_corpus.py
import glob, hashlib, json, os, struct

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
fx = os.path.join(root, "tests/fixtures/peft_extra")
out = os.path.join(root, "fuzz/corpus")


def put(target, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
        f.write(data)


def seed(mode, config, tensors):
    return bytes([mode]) + struct.pack("<I", len(config)) + config + tensors


cases = {}
for folder in (fx, os.path.join(root, "tests/fixtures/peft_tokens")):
    for line in open(os.path.join(folder, "cases.tsv")):
        if not line.startswith("#"):
            label, d, base, padded = line.split()
            cases[os.path.join(folder, d)] = (os.path.join(folder, base), int(padded))
    for d in sorted(glob.glob(os.path.join(folder, "refused/*"))):
        cases[d] = (os.path.join(folder, "bases/tied"), 0)

# Small files only (the mutator works best on short inputs), plus hand-made edge cases.
for f in sorted(glob.glob(os.path.join(fx, "**/*.safetensors"), recursive=True)):
    data = open(f, "rb").read()
    if len(data) <= 4096:
        put("fuzz_safetensors", data)


def st(header, data=b""):
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


put("fuzz_safetensors", st({}))
put("fuzz_safetensors", st({"__metadata__": {"format": "pt"}, "s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
                            "z": {"dtype": "BF16", "shape": [0, 3], "data_offsets": [4, 4]},
                            "b": {"dtype": "BOOL", "shape": [3], "data_offsets": [4, 7]}}, b"\0" * 7))
put("fuzz_safetensors", st({"w": {"dtype": "F16", "shape": [2, 2], "data_offsets": [1, 9]}}, b"\x01" * 9))

for d, (base, padded) in sorted(cases.items()):
    cfg = json.load(open(os.path.join(base, "config.json")))
    mode = (1 if cfg.get("tie_word_embeddings") else 0) | (2 if padded else 0)
    adir = os.path.join(d, "adapter")
    config = json.loads(open(os.path.join(adir, "adapter_config.json"), "rb").read())
    # Only the fields the importer reads, so the seeds stay small.
    read = ["trainable_token_indices", "modules_to_save", "ensure_weight_tying", "peft_type"]
    if config.get("peft_type") == "TRAINABLE_TOKENS":
        read += ["token_indices", "target_modules"]
    small = {k: v for k, v in config.items() if k in read}
    config = json.dumps(small).encode()
    vllm = os.path.join(adir, "new_embeddings.safetensors")
    if os.path.exists(vllm):
        put("fuzz_adapter", seed(mode | 4, config, open(vllm, "rb").read()))
    else:
        put("fuzz_adapter", seed(mode, config, open(os.path.join(adir, "adapter_model.safetensors"), "rb").read()))

for b in sorted(glob.glob(os.path.join(fx, "bases/*/config.json"))):
    bdir = os.path.dirname(b)
    weights = os.path.join(bdir, "model.safetensors")
    if os.path.exists(weights):
        put("fuzz_adapter", seed(16, open(b, "rb").read(), open(weights, "rb").read()))
print("corpus:", {t: len(os.listdir(os.path.join(out, t))) for t in os.listdir(out)})
