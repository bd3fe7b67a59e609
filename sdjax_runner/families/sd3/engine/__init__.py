"""SD 3 / 3.5 in the engine: its stages (:mod:`.stages`) and what the engine needs besides (:mod:`.family`)."""
