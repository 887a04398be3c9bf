"""Ray Serve app: `genrec serve`, the FastAPI ingress and its config."""
