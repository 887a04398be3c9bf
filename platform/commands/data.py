"""`genrec data ...`: build dataset folders (synthetic generator and importers)."""

import typer

app = typer.Typer(help="Create dataset folders: synthetic data or imports of public formats.", no_args_is_help=True)
import_app = typer.Typer(help="Import a public data set into a dataset folder.", no_args_is_help=True)
app.add_typer(import_app, name="import")
