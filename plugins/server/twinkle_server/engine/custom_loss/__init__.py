"""Custom losses uploaded through `/create_custom_loss`: the validated, compiled graph program (`program`), the ops it
may use (`ops`), its cost model (`cost`), the guard on its evaluation time (`guard`) and the program as a `Loss`
(`graph_loss`). The service keeps the uploaded specs per session (`service/custom_losses.py`)."""
