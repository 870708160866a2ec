"""Dashboards and alert rules generated from the engine's and the controller's metric catalogs."""
