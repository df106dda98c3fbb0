/*
 * test_glpk.c — GLPK is linked and solves integer programs: two small ILPs solved with
 * glp_intopt, checked against the optimum found by enumerating every integer point. The first
 * (Chvatal's example) has an integral LP relaxation; the second, a binary knapsack, does not,
 * so the solver must branch. GLPK prints nothing (glp_term_out off).
 *
 * Only src/plan/ calls GLPK in the product; this test calls it directly.
 */
#include "check.h"

#include <glpk.h>

#define MAX_VARS 4
#define MAX_ROWS 3

/* maximise obj . x subject to a x <= b, x integer in [0, upper] (binary when upper == 1) */
typedef struct {
    const char *name;
    int vars, rows;
    double obj[MAX_VARS];
    double a[MAX_ROWS][MAX_VARS];
    double b[MAX_ROWS];
    int upper[MAX_VARS];
} ilp;

/* Every integer point of the box, odometer order; returns the best objective, fills x. */
static double brute_force(const ilp *p, int x[MAX_VARS]) {
    int point[MAX_VARS] = {0};
    double best = -1e300;
    for (;;) {
        int feasible = 1;
        for (int r = 0; r < p->rows && feasible; r++) {
            double lhs = 0.0;
            for (int v = 0; v < p->vars; v++) lhs += p->a[r][v] * point[v];
            feasible = lhs <= p->b[r] + 1e-9;
        }
        if (feasible) {
            double value = 0.0;
            for (int v = 0; v < p->vars; v++) value += p->obj[v] * point[v];
            if (value > best) {
                best = value;
                for (int v = 0; v < p->vars; v++) x[v] = point[v];
            }
        }
        int v = 0;
        while (v < p->vars && point[v] == p->upper[v]) point[v++] = 0;
        if (v == p->vars) return best;
        point[v]++;
    }
}

/* Solves with glp_intopt; returns its status code (0 on success), fills objective and x. */
static int solve_glpk(const ilp *p, double *objective, double x[MAX_VARS], int *mip_status) {
    glp_prob *lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MAX);
    glp_add_rows(lp, p->rows);
    for (int r = 0; r < p->rows; r++) glp_set_row_bnds(lp, r + 1, GLP_UP, 0.0, p->b[r]);
    glp_add_cols(lp, p->vars);
    /* GLPK's matrix is triplets, 1-based (index 0 unused) */
    int ia[1 + MAX_ROWS * MAX_VARS], ja[1 + MAX_ROWS * MAX_VARS];
    double ar[1 + MAX_ROWS * MAX_VARS];
    int nz = 0;
    for (int v = 0; v < p->vars; v++) {
        if (p->upper[v] == 1) {
            glp_set_col_kind(lp, v + 1, GLP_BV);
        } else {
            glp_set_col_kind(lp, v + 1, GLP_IV);
            glp_set_col_bnds(lp, v + 1, GLP_LO, 0.0, 0.0); /* the constraints bound it above */
        }
        glp_set_obj_coef(lp, v + 1, p->obj[v]);
        for (int r = 0; r < p->rows; r++) {
            nz++;
            ia[nz] = r + 1;
            ja[nz] = v + 1;
            ar[nz] = p->a[r][v];
        }
    }
    glp_load_matrix(lp, nz, ia, ja, ar);
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON; /* solves the LP relaxation itself, no glp_simplex needed */
    parm.msg_lev = GLP_MSG_OFF;
    int ret = glp_intopt(lp, &parm);
    *mip_status = glp_mip_status(lp);
    *objective = glp_mip_obj_val(lp);
    for (int v = 0; v < p->vars; v++) x[v] = glp_mip_col_val(lp, v + 1);
    glp_delete_prob(lp);
    return ret;
}

static void check_ilp(const ilp *p, double expected) {
    int best_x[MAX_VARS];
    double best = brute_force(p, best_x);
    CHECK_CLOSE(best, expected, 0, 1e-9, p->name); /* the enumeration itself */
    double objective, x[MAX_VARS];
    int status;
    int ret = solve_glpk(p, &objective, x, &status);
    CHECK(ret == 0 && status == GLP_OPT, "%s: glp_intopt returned %d, status %d", p->name, ret,
          status);
    CHECK_CLOSE(objective, best, 0, 1e-9, p->name);
    /* the optimum of both programs is unique, so the point must match too */
    for (int v = 0; v < p->vars; v++) {
        CHECK_CLOSE(x[v], best_x[v], 0, 1e-9, p->name);
    }
}

int main(void) {
    glp_term_out(GLP_OFF);
    /* Chvatal, Linear Programming, ch. 2: optimum 13 at (2, 0, 1) */
    ilp chvatal = {"chvatal",  3,        3, {5, 4, 3}, {{2, 3, 1}, {4, 1, 2}, {3, 4, 2}},
                   {5, 11, 8}, {2, 1, 5}};
    check_ilp(&chvatal, 13.0);
    /* binary knapsack: the LP relaxation's 22 (x, y whole, z half) is not reachable; the
     * optimum 21 takes y, z, w */
    ilp knapsack = {"knapsack", 4, 1, {8, 11, 6, 4}, {{5, 7, 4, 3}}, {14}, {1, 1, 1, 1}};
    check_ilp(&knapsack, 21.0);
    return check_finish();
}
