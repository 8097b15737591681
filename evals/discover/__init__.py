"""`exactedit discover`: the phrases a model over-uses against the user's own writing.

    sources   model_texts / human_texts: replies, chat transcripts (OpenAI, ShareGPT, Claude Code),
              plain files, tagged by source, bounded and validated (DiscoverError)
    tokens    text -> sentences of word and punctuation tokens (code skipped, markup dropped)
    ngrams    both corpora -> one token stream -> n-gram counts of every order
    logodds   Monroe, Colaresi & Quinn's log-odds ratio with an informative Dirichlet prior
    ranking   discover / discover_paths -> Discovery (phrases by z), DiscoverConfig
    report    the table, the PNG, the JSON file

Imports quant and the standard library, numpy, wordfreq and matplotlib only.
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "DiscoverConfig": "ranking",
    "DiscoverError": "sources",
    "Discovery": "ranking",
    "Limits": "sources",
    "Text": "sources",
    "discover": "ranking",
    "discover_paths": "ranking",
    "human_texts": "sources",
    "model_texts": "sources",
    "plot_discovery": "report",
    "render_discovery": "report",
    "write_discovery": "report",
})
