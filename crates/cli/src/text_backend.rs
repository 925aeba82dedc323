//! PNG text with the glyphs where the font puts them. `plotters`' `ab_glyph` text drawing
//! (0.3.7) starts each glyph's ink at the pen position, dropping the glyph's left side bearing,
//! so letters sit unevenly ("fp 8 e4m3", "bf16 near est"). [`Glyphs`] wraps a drawing backend
//! and draws text itself: pen advanced by each glyph's advance and the kerning, each outline
//! placed at its own bounds (bearing included), baseline at the font's ascent. Everything else
//! goes to the wrapped backend unchanged. The SVG plots need none of this: their text is
//! `<text>` set by the viewer. Also here: the plots' embedded font ([`FONT`]).

use ab_glyph::{Font, FontRef, PxScale, ScaleFont};
use plotters::prelude::DrawingBackend;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind};
use std::sync::Once;

/// The plots' one font (DejaVu Sans), embedded.
pub const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Registers [`FONT`] as `plotters`' "sans-serif" (once per process).
pub(crate) fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, FONT)
            .map_err(|_| ())
            .expect("embedded font is valid");
    });
}

/// `inner` drawing its text in `font` (the plots' one font, whatever family a style names).
pub struct Glyphs<B> {
    pub inner: B,
    pub font: FontRef<'static>,
}

impl<B> Glyphs<B> {
    /// The glyphs of `text` at `size` px, positioned from the pen at (0, 0) with the baseline
    /// at the ascent, and the text's width and height.
    fn layout(&self, text: &str, size: f64) -> (Vec<ab_glyph::Glyph>, f32, f32) {
        let scale = PxScale::from(size as f32);
        let font = self.font.as_scaled(scale);
        let (mut pen, mut prev, mut glyphs) = (0f32, None, Vec::new());
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(p) = prev {
                pen += font.kern(p, id);
            }
            glyphs.push(id.with_scale_and_position(scale, ab_glyph::point(pen, font.ascent())));
            pen += font.h_advance(id);
            prev = Some(id);
        }
        (glyphs, pen, font.ascent() - font.descent())
    }
}

impl<B: DrawingBackend> DrawingBackend for Glyphs<B> {
    type ErrorType = B::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }
    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.ensure_prepared()
    }
    fn present(&mut self) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.present()
    }
    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.draw_pixel(point, color)
    }
    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.draw_line(from, to, style)
    }
    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }
    fn blit_bitmap(&mut self, pos: BackendCoord, size: (u32, u32), src: &[u8]) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn estimate_text_size<S: BackendTextStyle>(&self, text: &str, style: &S) -> Result<(u32, u32), DrawingErrorKind<B::ErrorType>> {
        let (_, w, h) = self.layout(text, style.size());
        Ok((w.ceil() as u32, h.ceil() as u32))
    }

    fn draw_text<S: BackendTextStyle>(&mut self, text: &str, style: &S, pos: BackendCoord) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let (glyphs, w, h) = self.layout(text, style.size());
        let dx = match style.anchor().h_pos {
            HPos::Left => 0.0,
            HPos::Right => -w,
            HPos::Center => -w / 2.0,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0.0,
            VPos::Center => -h / 2.0,
            VPos::Bottom => -h,
        };
        let trans = style.transform();
        let (width, height) = self.get_size();
        let mut pixels = Vec::new();
        for g in glyphs {
            if let Some(outline) = self.font.outline_glyph(g) {
                let b = outline.px_bounds();
                outline.draw(|x, y, coverage| {
                    let (px, py) = trans.transform((b.min.x + x as f32 + dx) as i32, (b.min.y + y as f32 + dy) as i32);
                    pixels.push(((pos.0 + px, pos.1 + py), coverage));
                });
            }
        }
        for ((x, y), coverage) in pixels {
            if x >= 0 && y >= 0 && (x as u32) < width && (y as u32) < height {
                self.inner.draw_pixel((x, y), BackendColor { alpha: color.alpha * coverage as f64, rgb: color.rgb })?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plotters::prelude::*;

    /// The leftmost inked column of `text` drawn at x = 0 on a white 60 x 40 bitmap.
    fn first_ink(text: &str, ours: bool) -> u32 {
        let font = FontRef::try_from_slice(FONT).unwrap();
        register_font();
        let mut buf = vec![255u8; 60 * 40 * 3];
        {
            let bitmap = BitMapBackend::with_buffer(&mut buf, (60, 40));
            let style = ("sans-serif", 24).into_font().color(&BLACK);
            if ours {
                let area = Glyphs { inner: bitmap, font }.into_drawing_area();
                area.draw(&Text::new(text, (0, 5), style)).unwrap();
            } else {
                let area = bitmap.into_drawing_area();
                area.draw(&Text::new(text, (0, 5), style)).unwrap();
            }
        }
        (0..60).find(|&x| (0..40).any(|y| buf[(y * 60 + x) * 3] < 128)).unwrap() as u32
    }

    #[test]
    fn glyphs_keep_their_left_bearing() {
        let font = FontRef::try_from_slice(include_bytes!("../assets/DejaVuSans.ttf")).unwrap();
        let glyph = font.glyph_id('1').with_scale(24.0);
        let bearing = font.outline_glyph(glyph).unwrap().px_bounds().min.x;
        assert!(bearing >= 2.0, "{bearing}");
        // ours starts the ink at the glyph's bearing; plotters' own drawing at 0
        assert_eq!(first_ink("1", true), bearing as u32);
        assert_eq!(first_ink("1", false), 0);
    }
}
