"""pytorch/examples gcn and gat, ported: Kipf & Welling's GCN (GraphConv: support = X W, output
= A_hat support (+ bias), two layers, ReLU, dropout, log_softmax) on a dense symmetric-normalized
adjacency matrix with self-loops, and the GAT of Velickovic et al. (GraphAttentionLayer: a shared
linear map per head, attention logits LeakyReLU(0.2)(a^T [Wh_i || Wh_j]), masked to the edges with
a large negative constant, softmax over neighbours, heads concatenated, ELU between layers, one
averaging output head). Both trained as the examples' train_iter(): model.train(), zero_grad,
NLLLoss on the training nodes only (indexed by idx_train), backward, Adam with weight decay 5e-4
(GCN lr 0.01, GAT lr 0.005). A random graph of 24 nodes and 12 features, 3 classes.

Dropout: the GCN's nn.Dropout masks are drawn by lazyrt and replayed in the eager oracle (see
_compare); the GAT example's F.dropout calls (on the features and the attention) are kept, with
p 0 in the numeric test."""

import torch
from torch import nn
from torch.nn import functional as F

import lazyrt
import lazyrt.torch
from _compare import (close, kept_fraction_ok, observe_dropouts, replay_masks, same_state, seen, seeded)

NODES, FEATURES, CLASSES, STEPS = 24, 12, 3, 5


class GraphConv(nn.Module):
    def __init__(self, input_dim, output_dim, use_bias=False):
        super().__init__()
        self.kernel = nn.Parameter(torch.empty(input_dim, output_dim))
        nn.init.xavier_normal_(self.kernel)
        self.bias = None
        if use_bias:
            self.bias = nn.Parameter(torch.zeros(output_dim))

    def forward(self, input_tensor, adj_mat):
        support = torch.mm(input_tensor, self.kernel)
        output = torch.mm(adj_mat, support)
        if self.bias is not None:
            output = output + self.bias
        return output


class GCN(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim, use_bias=True, dropout_p=0.5):
        super().__init__()
        self.gcn_layer1 = GraphConv(input_dim, hidden_dim, use_bias=use_bias)
        self.gcn_layer2 = GraphConv(hidden_dim, output_dim, use_bias=use_bias)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, input_tensor, adj_mat):
        x = F.relu(self.gcn_layer1(input_tensor, adj_mat))
        x = self.dropout(x)
        x = self.gcn_layer2(x, adj_mat)
        return F.log_softmax(x, dim=1)


class GraphAttentionLayer(nn.Module):
    def __init__(self, in_features, out_features, n_heads, concat=False, dropout=0.4, leaky_relu_slope=0.2):
        super().__init__()
        self.n_heads, self.concat, self.dropout = n_heads, concat, dropout
        if concat:
            assert out_features % n_heads == 0
            self.n_hidden = out_features // n_heads
        else:
            self.n_hidden = out_features
        self.W = nn.Parameter(torch.empty(in_features, self.n_hidden * n_heads))
        self.a = nn.Parameter(torch.empty(n_heads, 2 * self.n_hidden, 1))
        self.leakyrelu = nn.LeakyReLU(leaky_relu_slope)
        self.softmax = nn.Softmax(dim=1)
        nn.init.xavier_normal_(self.W)
        nn.init.xavier_normal_(self.a)

    def _get_attention_scores(self, h_transformed):
        source_scores = torch.matmul(h_transformed, self.a[:, :self.n_hidden, :])
        target_scores = torch.matmul(h_transformed, self.a[:, self.n_hidden:, :])
        e = source_scores + target_scores.mT  # (heads, n, n)
        return self.leakyrelu(e)

    def forward(self, h, adj_mat):
        n_nodes = h.shape[0]
        h_transformed = torch.mm(h, self.W)
        h_transformed = F.dropout(h_transformed, self.dropout, training=self.training)
        h_transformed = h_transformed.view(n_nodes, self.n_heads, self.n_hidden).permute(1, 0, 2)
        e = self._get_attention_scores(h_transformed)
        connectivity_mask = -9e16 * torch.ones_like(e)
        e = torch.where(adj_mat > 0, e, connectivity_mask)
        attention = F.softmax(e, dim=-1)
        attention = F.dropout(attention, self.dropout, training=self.training)
        h_prime = torch.matmul(attention, h_transformed)
        if self.concat:
            return h_prime.permute(1, 0, 2).contiguous().view(n_nodes, self.n_heads * self.n_hidden)
        return h_prime.mean(dim=0)


class GAT(nn.Module):
    def __init__(self, in_features, n_hidden, n_heads, num_classes, concat=False, dropout=0.4, leaky_relu_slope=0.2):
        super().__init__()
        self.gat1 = GraphAttentionLayer(in_features, n_hidden, n_heads, concat=concat, dropout=dropout,
                                        leaky_relu_slope=leaky_relu_slope)
        self.gat2 = GraphAttentionLayer(n_hidden, num_classes, 1, concat=False, dropout=dropout,
                                        leaky_relu_slope=leaky_relu_slope)

    def forward(self, input_tensor, adj_mat):
        x = self.gat1(input_tensor, adj_mat)
        x = F.elu(x)
        x = self.gat2(x, adj_mat)
        return F.log_softmax(x, dim=1)


def graph():
    g = torch.Generator().manual_seed(14)
    features = torch.rand(NODES, FEATURES, generator=g)
    labels = torch.randint(0, CLASSES, (NODES,), generator=g)
    upper = torch.triu((torch.rand(NODES, NODES, generator=g) < 0.2).float(), 1)
    adj = upper + upper.t() + torch.eye(NODES)
    d_inv_sqrt = adj.sum(1).pow(-0.5)
    adj_norm = d_inv_sqrt[:, None] * adj * d_inv_sqrt[None, :]
    idx_train = torch.arange(0, 16)
    return features, labels, adj, adj_norm, idx_train


def program(make_model, lr):
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=5e-4)
    criterion = nn.NLLLoss()

    def train_iter(features, adj_mat, labels, idx_train):  # the examples' train_iter body
        optimizer.zero_grad()
        output = model(features, adj_mat)
        loss = criterion(output[idx_train], labels[idx_train])
        loss.backward()
        optimizer.step()
        return loss, seen(model)

    return train_iter, {"model": model, "optimizer": optimizer}


def train_both(make_model, lr, adjacency):
    features, labels, adj, adj_norm, idx_train = graph()
    a = adj_norm if adjacency == "normalized" else adj
    eager, s_eager = seeded(lambda: program(make_model, lr))
    lazy_fn, s_lazy = seeded(lambda: program(make_model, lr))
    observe_dropouts(s_lazy["model"], s_eager["model"])
    lazy = lazyrt.torch.compile(lazy_fn)
    lazyrt.manual_seed(0)  # the masks lazyrt draws (whatever ran before), so the loss's fall is this program's
    kept, losses = [], []
    for k in range(STEPS):
        for s in (s_eager, s_lazy):
            s["model"].train()
        loss, dropped = lazy(features, a, labels, idx_train)
        replay_masks(s_eager["model"], dropped, kept)
        want, _ = eager(features, a, labels, idx_train)
        close(loss, want, f"step {k} loss")
        same_state(s_lazy, s_eager, f"after step {k}:")
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert lazy.captures == 1
    return kept


def test_gcn_trains_as_in_eager():
    kept = train_both(lambda: GCN(FEATURES, 16, CLASSES, dropout_p=0.5), 0.01, "normalized")
    kept_fraction_ok(kept, slack=0.15)


def test_gat_trains_as_in_eager():
    train_both(lambda: GAT(FEATURES, 16, 4, CLASSES, concat=True, dropout=0.0), 0.005, "binary")
