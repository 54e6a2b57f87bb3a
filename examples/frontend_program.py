"""An SGLang frontend program (``sgl.function``) against a server running SpecExit + D-Cut.

The extension is configured on the server (``--specexit``, ``--dcut``); frontend programs get the
server's settings: ``sgl.gen`` has no ``custom_params`` argument, so per-request SpecExit options are
not available here (use the OpenAI or ``/generate`` APIs for those, see ``openai_custom_params.py``).

    python examples/frontend_program.py --url http://127.0.0.1:30000
"""

import argparse
import json

import sglang as sgl


@sgl.function
def solve(s, question):
    s += sgl.user(question)
    # the tiny thinking model's chat template opens the assistant turn with <think>
    s += sgl.assistant(sgl.gen("completion", max_tokens=256, temperature=0.0))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--questions", nargs="+", default=["Compute: 7 + 4 - 2", "Compute: 3 - 8"])
    args = ap.parse_args(argv)
    sgl.set_default_backend(sgl.RuntimeEndpoint(args.url))
    states = solve.run_batch([{"question": q} for q in args.questions], temperature=0.0)
    for q, st in zip(args.questions, states):
        meta = st.get_meta_info("completion") or {}
        print(json.dumps({"question": q, "completion": st["completion"],
                          "completion_tokens": meta.get("completion_tokens"),
                          "specexit": {k: v for k, v in meta.items() if k.startswith("specexit")}}))


if __name__ == "__main__":
    main()
