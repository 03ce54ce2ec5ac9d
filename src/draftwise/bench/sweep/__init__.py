"""The bench proper (`draftwise bench`): prompts x methods x sweep settings decoded back to back
through the public Engine API (runner), what a run runs (config: BenchConfig and its variants;
methods: a method's name to the engine's policy and drafters), the engine it loads (engine_setup)
and each record against its baseline (compare)."""
