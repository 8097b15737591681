"""`exactedit persona`: a persona's style taught to the output head (`solve head --rank 1`) from the
model's own replies with and without the persona's system prompt, measured as a rate in free
generation: config (the inputs and settings), pipeline (the resumable stages), report."""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "PersonaConfig": "config",
    "PersonaError": "config",
    "PersonaResult": "pipeline",
    "run_persona": "pipeline",
})
