"""`exactedit discover`: the phrases a model over-uses against the user's own writing.

    sources   model_texts / human_texts: replies, chat transcripts (OpenAI, ShareGPT, Claude Code),
              plain files, tagged by source, bounded and validated (DiscoverError)
    tokens    text -> sentences of word and punctuation tokens (code skipped, markup dropped)
    ngrams    both corpora -> one token stream -> n-gram counts of every order
    logodds   Monroe, Colaresi & Quinn's log-odds ratio with an informative Dirichlet prior
    language  the second reference: a gram's rate in written language (wordfreq), the Poisson bound
    kinds     style or topic: dispersion over the prompts, echo of the prompts' words, function words
    ranking   discover / discover_paths -> Discovery (phrases by kind and score), DiscoverConfig
    closest   with nothing listed: the nearest miss and what would list it
    report    the table, the PNG, the JSON file

Imports exactedit's base modules (errors, files), the standard library, numpy, scipy, wordfreq and
matplotlib only.
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "DiscoverConfig": "ranking",
    "DiscoverError": "sources",
    "KINDS": "kinds",
    "Discovery": "ranking",
    "Limits": "sources",
    "Text": "sources",
    "Texts": "sources",
    "discover": "ranking",
    "discover_paths": "ranking",
    "human_texts": "sources",
    "model_texts": "sources",
    "over_limits": "sources",
    "plot_discovery": "report",
    "render_discovery": "report",
    "write_discovery": "report",
})
