#!/usr/bin/env python3
"""Download C4 `en` shards and the T5 tokenizer for the paper-scale configs.

Fetches, with `huggingface_hub.hf_hub_download`, from the dataset repo `allenai/c4`:
    en/c4-train.XXXXX-of-01024.json.gz       (--train-shards N: shards 0..N-1, ~356k docs each)
    en/c4-validation.XXXXX-of-00008.json.gz  (--val-shards N: shards 0..N-1)
and `tokenizer.json` from --tokenizer-repo (default google-t5/t5-base), into --out
(default data/local/c4, git-ignored). hf_hub_download keeps the repo layout, so the shards
land in <out>/en/, which is where configs/paper/base_llama100m.toml looks:
    train      = ["data/local/c4/en/c4-train.*-of-01024.json.gz"]
    validation = ["data/local/c4/en/c4-validation.*-of-00008.json.gz"]
(The configs use the identical T5 tokenizer bundled at data/tokenizers/t5-tokenizer.json;
the downloaded <out>/tokenizer.json is there to check against or to point data.tokenizer at.)

How much: a train shard holds ~356k documents, roughly 150M T5 tokens, so the paper's run
(20000 steps x 512 x 256 = 2.6B tokens) reads ~18 shards once (fewer shards are cycled);
one validation shard (~45k documents, ~20M tokens) covers the 10M validation tokens.

    python3 scripts/fetch_c4.py --train-shards 18 --val-shards 1
    python3 scripts/fetch_c4.py --train-shards 2 --dry-run     # print what would be fetched

Needs `pip install huggingface_hub` and network access; files already present are skipped.
"""

import argparse
import os
import sys

C4_REPO = "allenai/c4"
TRAIN_TOTAL = 1024
VAL_TOTAL = 8


def train_file(i):
    return f"en/c4-train.{i:05d}-of-{TRAIN_TOTAL:05d}.json.gz"


def val_file(i):
    return f"en/c4-validation.{i:05d}-of-{VAL_TOTAL:05d}.json.gz"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train-shards", type=int, default=1, help=f"train shards 0..N-1 (0..{TRAIN_TOTAL})")
    p.add_argument("--val-shards", type=int, default=1, help=f"validation shards 0..N-1 (0..{VAL_TOTAL})")
    p.add_argument("--out", default="data/local/c4", help="output folder (default data/local/c4)")
    p.add_argument("--tokenizer-repo", default="google-t5/t5-base",
                   help="model repo whose tokenizer.json to fetch ('' = none)")
    p.add_argument("--repo", default=C4_REPO, help="dataset repo (default allenai/c4)")
    p.add_argument("--force", action="store_true", help="download even if the file exists")
    p.add_argument("--dry-run", action="store_true", help="print what would be fetched, fetch nothing")
    a = p.parse_args(argv)
    if not 0 <= a.train_shards <= TRAIN_TOTAL:
        p.error(f"--train-shards must be in 0..{TRAIN_TOTAL}, got {a.train_shards}")
    if not 0 <= a.val_shards <= VAL_TOTAL:
        p.error(f"--val-shards must be in 0..{VAL_TOTAL}, got {a.val_shards}")
    if a.train_shards + a.val_shards == 0 and not a.tokenizer_repo:
        p.error("nothing to fetch")
    return a


def plan(a):
    """(repo_id, repo_type, filename) of every file to fetch."""
    files = [(a.repo, "dataset", train_file(i)) for i in range(a.train_shards)]
    files += [(a.repo, "dataset", val_file(i)) for i in range(a.val_shards)]
    if a.tokenizer_repo:
        files.append((a.tokenizer_repo, "model", "tokenizer.json"))
    return files


def get_downloader():
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        sys.exit("fetch_c4.py: needs huggingface_hub (pip install huggingface_hub)")
    return hf_hub_download


def main(argv=None, downloader=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    files = plan(a)
    if a.dry_run:
        for repo, kind, name in files:
            print(f"would fetch {kind} {repo}: {name} -> {os.path.join(a.out, name)}")
        print(f"{len(files)} file(s); nothing downloaded (--dry-run)")
        return 0
    download = downloader or get_downloader()
    os.makedirs(a.out, exist_ok=True)
    fetched = skipped = 0
    for repo, kind, name in files:
        dest = os.path.join(a.out, name)
        if not a.force and os.path.isfile(dest) and os.path.getsize(dest) > 0:
            print(f"have  {dest}")
            skipped += 1
            continue
        path = download(repo_id=repo, filename=name, repo_type=kind, local_dir=a.out)
        if os.path.abspath(path) != os.path.abspath(dest):
            # older huggingface_hub versions may return a cache path: put the file in place
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            import shutil
            shutil.copyfile(path, dest)
        print(f"got   {dest} ({os.path.getsize(dest)} bytes)")
        fetched += 1
    print(f"{fetched} fetched, {skipped} already present, in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
