"""lowcomm: compressed collective communication for training over WAN links.

`import lowcomm.torch` registers the torch.distributed backend "lowcomm".
"""
