"""pytorch/examples word_language_model, its Transformer variant (--model Transformer):
positional encoding, nn.TransformerEncoder given the causal mask the model builds on first use
and caches on itself (self.src_mask), trained by the same loop body as the RNN models (see
test_word_language_model.py: model.zero_grad(), backward, clip_grad_norm_ with args.clip,
the hand-written SGD update with the global lr, divided by 4 between epochs)."""

from test_word_language_model import draws_new_masks, trains_as_in_eager


def test_transformer_language_model_trains_as_in_eager():
    trains_as_in_eager("Transformer")


def test_transformer_language_model_with_all_its_dropout_draws_new_masks():
    draws_new_masks("Transformer")
