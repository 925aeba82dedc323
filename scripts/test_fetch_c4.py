#!/usr/bin/env python3
"""Tests of scripts/fetch_c4.py (stdlib only; no network): argument handling, --dry-run, and
the download path with hf_hub_download replaced by a function that copies local files laid
out like the allenai/c4 repo (built from /work/shared/data/corpus when present, else
generated). Run: python3 scripts/test_fetch_c4.py"""

import contextlib
import gzip
import io
import json
import os
import shutil
import sys
import tempfile
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fetch_c4  # noqa: E402

SHARED = "/work/shared/data/corpus"


def run(argv, downloader=None):
    """main(argv) -> (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = fetch_c4.main(argv, downloader=downloader)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def write_shard(path, docs):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"text": d, "timestamp": "", "url": f"https://example.org/{i}"}) + "\n")


class FakeHub:
    """Stands in for hf_hub_download: serves files from a local folder per repo."""

    def __init__(self, root):
        self.root = root
        self.calls = []

    def __call__(self, repo_id, filename, repo_type=None, local_dir=None, **kw):
        self.calls.append((repo_id, repo_type, filename))
        src = os.path.join(self.root, repo_id, filename)
        if not os.path.isfile(src):
            raise FileNotFoundError(f"404: {repo_id}/{filename}")
        dest = os.path.join(local_dir, filename)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(src, dest)
        return dest


class FetchC4Test(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)
        hub = os.path.join(self.tmp, "hub")
        c4 = os.path.join(hub, "allenai/c4")
        # two train shards and one validation shard, real text where the shared corpus exists
        for i in range(2):
            dest = os.path.join(c4, fetch_c4.train_file(i))
            src = os.path.join(SHARED, f"en-train.0000{i}-of-00004.json.gz")
            if os.path.isfile(src):
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copyfile(src, dest)
            else:
                write_shard(dest, [f"train shard {i} document {j}" for j in range(5)])
        write_shard(os.path.join(c4, fetch_c4.val_file(0)), ["a validation document"])
        tok = os.path.join(hub, "google-t5/t5-base/tokenizer.json")
        os.makedirs(os.path.dirname(tok))
        with open(tok, "w") as f:
            json.dump({"model": {"type": "Unigram"}}, f)
        self.hub = FakeHub(hub)
        self.out = os.path.join(self.tmp, "data/local/c4")

    def test_file_names_follow_the_c4_layout(self):
        self.assertEqual(fetch_c4.train_file(0), "en/c4-train.00000-of-01024.json.gz")
        self.assertEqual(fetch_c4.train_file(1023), "en/c4-train.01023-of-01024.json.gz")
        self.assertEqual(fetch_c4.val_file(7), "en/c4-validation.00007-of-00008.json.gz")

    def test_defaults(self):
        a = fetch_c4.parse_args([])
        self.assertEqual((a.train_shards, a.val_shards, a.out), (1, 1, "data/local/c4"))
        self.assertEqual(a.tokenizer_repo, "google-t5/t5-base")
        self.assertFalse(a.dry_run)

    def test_bad_arguments_exit_with_usage_error(self):
        for argv in (["--train-shards", "1025"], ["--val-shards", "9"], ["--train-shards", "-1"],
                     ["--train-shards", "x"], ["--train-shards", "0", "--val-shards", "0", "--tokenizer-repo", ""],
                     ["--bogus"]):
            code, _, err = run(argv, downloader=self.hub)
            self.assertEqual(code, 2, argv)
            self.assertIn("usage", err, argv)
        self.assertEqual(self.hub.calls, [])

    def test_dry_run_prints_and_fetches_nothing(self):
        code, out, _ = run(["--train-shards", "3", "--val-shards", "2", "--out", self.out, "--dry-run"],
                           downloader=self.hub)
        self.assertEqual(code, 0)
        self.assertEqual(self.hub.calls, [])
        self.assertFalse(os.path.exists(self.out))
        for name in ("en/c4-train.00002-of-01024.json.gz", "en/c4-validation.00001-of-00008.json.gz",
                     "tokenizer.json"):
            self.assertIn(name, out)
        self.assertIn("6 file(s)", out)

    def test_dry_run_needs_no_huggingface_hub(self):
        with mock.patch.object(fetch_c4, "get_downloader", side_effect=AssertionError("imported")):
            code, _, _ = run(["--dry-run"])
        self.assertEqual(code, 0)

    def test_downloads_into_the_config_layout_and_skips_present_files(self):
        code, out, _ = run(["--train-shards", "2", "--val-shards", "1", "--out", self.out], downloader=self.hub)
        self.assertEqual(code, 0, out)
        self.assertEqual(self.hub.calls, [
            ("allenai/c4", "dataset", "en/c4-train.00000-of-01024.json.gz"),
            ("allenai/c4", "dataset", "en/c4-train.00001-of-01024.json.gz"),
            ("allenai/c4", "dataset", "en/c4-validation.00000-of-00008.json.gz"),
            ("google-t5/t5-base", "model", "tokenizer.json"),
        ])
        # where configs/paper/base_llama100m.toml looks, readable as C4 JSON lines
        for name in ("en/c4-train.00000-of-01024.json.gz", "en/c4-train.00001-of-01024.json.gz",
                     "en/c4-validation.00000-of-00008.json.gz"):
            with gzip.open(os.path.join(self.out, name), "rt", encoding="utf-8") as f:
                doc = json.loads(f.readline())
            self.assertIn("text", doc)
            self.assertIn("url", doc)
        self.assertTrue(os.path.isfile(os.path.join(self.out, "tokenizer.json")))
        self.assertIn("4 fetched, 0 already present", out)
        # second call: everything present, nothing fetched
        self.hub.calls.clear()
        code, out, _ = run(["--train-shards", "2", "--val-shards", "1", "--out", self.out], downloader=self.hub)
        self.assertEqual((code, self.hub.calls), (0, []))
        self.assertIn("0 fetched, 4 already present", out)
        # --force fetches again
        code, _, _ = run(["--train-shards", "1", "--val-shards", "0", "--tokenizer-repo", "",
                          "--out", self.out, "--force"], downloader=self.hub)
        self.assertEqual(self.hub.calls, [("allenai/c4", "dataset", "en/c4-train.00000-of-01024.json.gz")])

    def test_a_cache_path_answer_is_copied_into_place(self):
        cache = os.path.join(self.tmp, "cache")

        def cache_download(repo_id, filename, repo_type=None, local_dir=None):
            path = os.path.join(cache, repo_id, filename)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            shutil.copyfile(os.path.join(self.hub.root, repo_id, filename), path)
            return path

        code, _, _ = run(["--train-shards", "1", "--val-shards", "0", "--tokenizer-repo", "", "--out", self.out],
                         downloader=cache_download)
        self.assertEqual(code, 0)
        self.assertTrue(os.path.isfile(os.path.join(self.out, "en/c4-train.00000-of-01024.json.gz")))

    def test_missing_file_raises(self):
        with self.assertRaises(FileNotFoundError):
            fetch_c4.main(["--train-shards", "3", "--val-shards", "0", "--out", self.out], downloader=self.hub)

    def test_uses_hf_hub_download_by_default(self):
        fake_module = mock.MagicMock()
        fake_module.hf_hub_download = self.hub
        with mock.patch.dict(sys.modules, {"huggingface_hub": fake_module}):
            code, _, _ = run(["--train-shards", "1", "--val-shards", "0", "--tokenizer-repo", "", "--out", self.out])
        self.assertEqual(code, 0)
        self.assertEqual(len(self.hub.calls), 1)

    def test_missing_huggingface_hub_is_a_clear_error(self):
        with mock.patch.dict(sys.modules, {"huggingface_hub": None}):
            code, _, _ = run(["--train-shards", "1", "--out", self.out])
        self.assertIn("pip install huggingface_hub", str(code))


if __name__ == "__main__":
    unittest.main()
