"""OpenAI-client example: per-request SpecExit options through SGLang's ``custom_params``.

Every SpecExit option can be set per request with a ``specexit_`` key (one-level dict of scalars):
``specexit_enable``, ``specexit_method``, ``specexit_smoothing``, ``specexit_ewma_alpha``,
``specexit_window``, ``specexit_confidence_threshold``, ``specexit_progress_threshold``,
``specexit_remain_threshold``, ``specexit_min_think_tokens``, ``specexit_max_think_tokens``,
``specexit_max_think_grace``. An invalid value fails that request only, with a message naming the key.

    python examples/openai_custom_params.py --url http://127.0.0.1:30000
"""

import argparse
import json

from openai import BadRequestError, OpenAI


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--question", default="Compute: 7 + 4 - 2")
    args = ap.parse_args(argv)
    client = OpenAI(base_url=args.url + "/v1", api_key="none")
    model = client.models.list().data[0].id
    variants = {
        "server defaults": {},
        "SpecExit off for this request": {"specexit_enable": False},
        "eager exit (low thresholds, mean smoother)": {"specexit_confidence_threshold": 0.5,
                                                       "specexit_smoothing": "mean", "specexit_window": 3},
        "invalid option": {"specexit_window": 0},
    }
    for name, params in variants.items():
        try:
            r = client.chat.completions.create(model=model, temperature=0.0, max_tokens=256,
                                               messages=[{"role": "user", "content": args.question}],
                                               extra_body={"custom_params": params} if params else None)
            msg = r.choices[0].message
            print(json.dumps({"variant": name, "ok": True, "completion_tokens": r.usage.completion_tokens,
                              "reasoning": getattr(msg, "reasoning_content", None), "answer": msg.content}))
        except BadRequestError as e:
            print(json.dumps({"variant": name, "ok": False, "status": e.status_code, "error": str(e)}))


if __name__ == "__main__":
    main()
