"""Integrations of specdec_ext's verification into serving engines (imported only by the engines' plugin loaders)."""
