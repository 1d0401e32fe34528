"""Framework integrations that go beyond an import change: `tunix` (TrainingHooks)."""
