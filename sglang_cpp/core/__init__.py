"""The pure core: the cost model t(L, x), the plan value, the planners, upstream's predictor, the layer
partitioner, the policy dispatch and the batch policies. numpy/scipy only: it imports no other wing,
neither torch nor sglang, so every stage of a server and every offline tool plans alike."""
