"""tfdeploy remote side: stdlib-only code that runs on every host."""
