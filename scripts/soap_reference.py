# SOAP's equations as crates/optim/src/rules/soap/mod.rs states them, in float64 with numpy, written
# apart from the Rust code: the expected weights of crates/optim/tests/soap.rs
# (refresh_every_update_matches_the_reference_maths). Usage: python3 scripts/soap_reference.py
# (refresh interval 1, a 3 x 2 matrix and a vector of 2, 4 updates).
import numpy as np
np.set_printoptions(precision=10)
b1, b2, eps, bs, lr = 0.9, 0.999, 1e-8, 0.95, 0.1
W0 = np.array([[0.5, -0.25], [0.125, 0.75], [-0.5, 0.375]])
b0 = np.array([1.0, -1.0])
G = [np.array([[0.3, -0.2], [0.1, 0.4], [-0.5, 0.25]]),
     np.array([[-0.1, 0.6], [0.2, -0.3], [0.4, 0.1]]),
     np.array([[0.25, 0.15], [-0.35, 0.05], [0.2, -0.45]]),
     np.array([[0.05, -0.3], [0.45, 0.2], [-0.15, 0.35]])]
gb = [np.array([0.2, -0.1]), np.array([0.3, 0.05]), np.array([-0.1, 0.2]), np.array([0.0, 0.4])]
def eig_desc(a):
    w, v = np.linalg.eigh(a)
    return v[:, ::-1]
def refresh(a, q):
    aq = a @ q
    est = np.einsum('ij,ij->j', q, aq)
    order = np.argsort(-est, kind='stable')
    qn, _ = np.linalg.qr(aq[:, order])
    return qn, order
W = W0.copy(); m = np.zeros_like(W); v = np.zeros_like(W); L = np.zeros((3, 3)); R = np.zeros((2, 2))
QL = QR = None
bb = b0.copy(); mb = np.zeros(2); vb = np.zeros(2)
for t in range(1, 5):
    g = G[t - 1]
    # the vector: plain Adam (no preconditioner)
    mb = b1 * mb + (1 - b1) * gb[t - 1]; vb = b2 * vb + (1 - b2) * gb[t - 1] ** 2
    bb = bb - lr * (mb / (1 - b1 ** t)) / (np.sqrt(vb / (1 - b2 ** t)) + eps)
    if QL is None:
        L = bs * L + (1 - bs) * g @ g.T; R = bs * R + (1 - bs) * g.T @ g
        QL, QR = eig_desc(L), eig_desc(R)
        continue
    gr = QL.T @ g @ QR
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * gr ** 2
    mr = QL.T @ m @ QR
    n = (mr / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    W = W - lr * QL @ n @ QR.T
    L = bs * L + (1 - bs) * g @ g.T; R = bs * R + (1 - bs) * g.T @ g
    QL, ol = refresh(L, QL); QR, orr = refresh(R, QR)
    v = v[ol, :][:, orr]
    print(t, 'orders', ol, orr)
print('W', repr(W.flatten()))
print('b', repr(bb))
