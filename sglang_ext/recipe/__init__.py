"""Training recipes for speculative-decoding drafts of real targets.

``python -m sglang_ext.recipe.eagle3 --target DIR --out DIR`` trains a one-layer EAGLE3 draft
for a Hugging Face Llama-family target (:mod:`sglang_ext.recipe.eagle3`).  Only stage (a)
(:mod:`sglang_ext.recipe.generate`) imports SGLang, inside its function.
"""
