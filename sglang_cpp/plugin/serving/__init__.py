"""What runs on every scheduler step: the sizer that plans each prompt's chunks (`sizer`), the admission hooks
that apply them (`admission`), the forwards timed and logged (`forwards`, `steps`), the P2P receive (`p2p`),
the batch policies (`batch`) and online refinement (`online`). Imports pd and compat below it, never startup."""
