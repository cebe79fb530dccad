"""One sequence's life in the batch: how it starts, its state token by token, the batch's
live sequences, and choices that follow their leader's prefill."""
