"""Pieces shared by lowcomm's training examples (DiLoCo and the two-stage AQ-SGD pipeline).

``data``: byte corpus from the Python standard library's sources; ``gpt``: a small byte-level
GPT and its pipeline split; ``meter``: compute utilisation and bytes moved; ``plot``: loss
curves and CSV.
"""
