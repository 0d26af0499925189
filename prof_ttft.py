import time, torch, statistics
from arr_coc.model import ARRCOCQwen
from arr_coc.tiny import random_vlm, qwen2_vl_2b_config
from arr_coc.qwen import default_dtype, mrope_position_ids, raster_block, view_tensor, upsample_map, ImageBlock
from arr_coc.bench import test_image
dev = torch.device("cuda")
model = ARRCOCQwen(random_vlm(qwen2_vl_2b_config(), "cuda", default_dtype(dev), "2B"))
vlm = model.vlm
q = "Describe the image in detail."
def T(name, fn, acc):
    torch.cuda.synchronize(); t = time.perf_counter(); r = fn(); torch.cuda.synchronize(); acc.setdefault(name, []).append((time.perf_counter() - t) * 1000); return r
for size in (448, 896, 1792):
    img = test_image(size)
    acc = {}
    for it in range(8):
        with torch.no_grad():
            views = T("views", lambda: model.views(img), acc)
            g = T("gestalt_vit", lambda: vlm.encode_view(views.gestalt), acc)
            ids = T("prompt_ids", lambda: vlm.prompt_ids(q, [g.shape[0]]), acc)
            pos = T("mrope", lambda: mrope_position_ids(ids, vlm.image_token_id, [raster_block(views.gestalt_grid)]), acc)
            emb = T("embed", lambda: vlm.embed(ids, [g]), acc)
            at = (ids[0] == vlm.image_token_id).nonzero()[:, 0]; span = (int(at[0]), int(at[-1]) + 1)
            att = T("prior", lambda: vlm.gestalt_attention(emb, pos, span, span[1] + 1, 0.5), acc)
            prior = T("upsample", lambda: upsample_map(att, views.gestalt_grid, views.candidate_grid), acc)
            hi = T("view_tensor", lambda: view_tensor(views.highres, vlm.device), acc)
            tex = T("texture", lambda: model.texture(hi, views.candidate_grid), acc)
            qe = T("question_embeds", lambda: vlm.question_embeds(q), acc)
            from arr_coc.model import Observation, Scene
            o = Observation(views, q, g, qe, prior, hi, tex)
            maps = T("score", lambda: model.score(o), acc)
            out = T("select", lambda: model.select(Scene(o, maps)), acc)
            pix = T("image_inputs", lambda: vlm.image_inputs(hi)[0], acc)
            sac = T("saccade_vit", lambda: vlm.encode_cells(pix, views.candidate_grid, out.positions[0]), acc)
            blocks = [raster_block(views.gestalt_grid), ImageBlock(views.candidate_grid, out.positions[0].cpu())]
            ids2 = T("prompt_ids2", lambda: vlm.prompt_ids(q, [g.shape[0], 273]), acc)
            pos2 = T("mrope2", lambda: mrope_position_ids(ids2, vlm.image_token_id, blocks), acc)
            emb2 = T("embed2", lambda: vlm.embed(ids2, [g, sac]), acc)
            T("prefill+1tok", lambda: vlm.generate(1, inputs_embeds=emb2, position_ids=pos2), acc)
            T("answer_arr_1tok", lambda: model.answer(img, q, "arr", max_new_tokens=1), acc)
    print(f"--- {size}")
    for k, v in acc.items():
        print(f"{k:18s} {statistics.median(v[3:]):7.2f} ms")
